"""The gradients held beside an op (`planner.search.held`, `Problem.held_beside`): the flat ILP counting them finds
the brute-force optimum of the formulas with them counted, and on models this project did not write they are a
lower bound of what the plan's accounting counts, which the formulas alone are not."""

from __future__ import annotations

import random

import numpy as np
import pytest
from synthetic_problems import every_assignment, repeated_blocks

from cost_models.hardware import load_profile
from cost_models.mesh import candidate_meshes
from planner import get_example
from planner.plans.assemble import assemble_plan
from planner.search.build import build_problem
from planner.search.solve import fixing
from planner.search.solve.evaluate import evaluate_indexed, held_bytes, held_peak
from planner.search.solve.ilp import build_flat
from planner.search.solve.indexed import IndexedProblem, ProblemError
from planner.search.solve.milp import solve_milp
from planner.search.solve.problem import Apart, HeldBeside, HeldLess, HeldSaved, OptimizerStep, Problem, Solution
from planner.trace.tracer import capture


def _with_held(seed: int, fraction: float) -> Problem:
    """Two blocks of two nodes, conversions on every edge, and held rows of every kind: terms on other nodes,
    pairs, terms of one node counted where a pair of two others holds (or where that or a fourth node's own condition
    does), a negative floor (a gradient counted where a pair's condition holds), at a recomputation (with the
    earlier nodes' recomputed bytes), beside a conversion; copies saved beyond the formulas, and bytes they count
    twice where one of two earlier nodes saves them and a third hands them on as they are; the optimizer step beside
    the states."""
    rng = np.random.default_rng(seed)
    problem = repeated_blocks(rng, n_blocks=2, block_nodes=2, choices=3, budget_fraction=fraction)
    for e in problem.edges:
        e.transient_bytes = rng.integers(0, 900, size=e.cost_s.shape)
    names = [n.name for n in problem.nodes]

    def vec(name: str, most: int = 600) -> list[int]:
        return [int(x) for x in rng.integers(0, most, size=len(problem.nodes[names.index(name)].choices))]

    for k in range(8):
        node = names[int(rng.integers(1, len(names)))]
        others = [n for n in names if n != node]
        a, b = (others[int(i)] for i in rng.choice(len(others), 2, replace=False))
        most = 500
        pair = [[most * int(rng.random() < 0.5) for _ in vec(b)] for _ in vec(a)]
        block = next((blk for blk in problem.blocks if node in blk.nodes), None)
        at = block is not None and k % 4 < 2
        earlier = [(w, vec(w)) for w in block.nodes[:block.nodes.index(node)]] if at else []
        source = next((e.src for e in problem.edges if e.dst == node), None) if k % 2 else None
        # a gradient counted only where a pair's condition holds, set by a third node (`problem.Apart`); or where
        # any of several holds: that pair's, or one node's own
        c = next(n for n in others if n not in (a, b))
        conditions: list = [(a, b, [[bool(x) for x in row] for row in pair])]
        if k % 4 == 2:
            conditions.append((node, None, [bool(rng.random() < 0.4) for _ in vec(node)]))
        apart = [Apart(c, vec(c), conditions)] if k % 2 == 0 else []
        problem.held_beside.append(HeldBeside(node, vec(node), [(a, vec(a))], int(rng.integers(0, 100)) - most * (k % 3 == 0),
                                              at, source, [(a, b, pair)], earlier, apart=apart))
    for e in problem.edges[::3]:  # copies saved beyond the formulas: in blocks (dropped when checkpointed) and out
        problem.held_saved.append(HeldSaved(e.src, e.dst, [[int(x) * int(rng.random() < 0.5) for x in vec(e.dst, 300)]
                                                           for _ in vec(e.src)]))
    def marks(name: str) -> list[bool]:
        return [bool(rng.random() < 0.5) for _ in vec(name)]

    for _ in range(3):  # bytes counted twice, taken off only where one of two earlier nodes saves them and a third's
        node = names[int(rng.integers(2, len(names)))]  # choice hands it on as it is (`HeldLess.where`)
        a, b = (names[int(i)] for i in rng.choice(names.index(node), 2, replace=False))
        c = names[int(rng.integers(len(names)))]
        problem.held_less.append(HeldLess(node, vec(node, 3000), [[(a, marks(a)), (b, marks(b))], [(c, marks(c))]]))
    # the optimizer step beside the states: summed (foreach) or the largest (single-tensor)
    problem.held_step = OptimizerStep([(name, vec(name, 4000)) for name in names[:4]], summed=seed % 2 == 0, fixed=50)
    return problem


def _best(ip: IndexedProblem, sets: frozenset[int] | None) -> tuple[float, float]:
    """The fastest fitting time with the held rows counted and without them (brute force), among assignments
    checkpointing exactly `sets` (None: any)."""
    with_rows = without = np.inf
    for choice, ckpt, time_s, peak, _ in every_assignment(ip):
        if sets is not None and frozenset(ckpt) != sets:
            continue
        if peak <= ip.budget:
            without = min(without, time_s)
        if held_peak(ip, choice, ckpt) <= ip.budget:
            with_rows = min(with_rows, time_s)
    return with_rows, without


@pytest.mark.parametrize("seed, fraction", [(1, 0.8), (2, 1.0), (4, 1.0), (7, 0.8)])
def test_the_flat_ilp_counting_held_rows_is_their_optimum(seed: int, fraction: float) -> None:
    ip = IndexedProblem(_with_held(seed, fraction))
    binding = 0
    for sets in [None, *fixing.checkpoint_sets(ip)]:
        with_rows, without = _best(ip, sets)
        binding += with_rows != without
        built = build_flat(ip, "time", ip.budget, checkpointed=sets, held=True)
        res = solve_milp(built.model, work_limit=None)
        if not np.isfinite(with_rows):
            assert res.status == "infeasible"
            continue
        assert res.status == "optimal"
        choice, blocks = built.extract(res.x)
        time_s = evaluate_indexed(ip, choice, blocks)[0]
        assert time_s == pytest.approx(with_rows, rel=1e-9)
        assert held_peak(ip, choice, blocks) <= ip.budget
    assert binding > 0  # the rows change some optimum: the check is not vacuous


@pytest.mark.parametrize(("where", "nbytes", "error"), [
    ([[("L0.op0", [True])]], 100, "with 1 marks; expected 3"),
    ([[]], 100, "empty clause"),
    ([[("L0.op0", [True, False, True])]], -100, "negative bytes"),
])
def test_a_malformed_held_less_entry_is_refused_with_what_is_wrong(where: list, nbytes: int, error: str) -> None:
    """A `HeldLess` entry taken off under clauses: marks one per choice of the node named, no empty clause (it never
    holds), bytes >= 0 (the ILP counts them down to a product of the clauses, exact only so)."""
    problem = _with_held(1, 1.0)
    problem.held_less = [HeldLess("L1.op0", [nbytes] * 3, where)]
    with pytest.raises(ProblemError, match=error):
        IndexedProblem(problem)


@pytest.mark.parametrize("name", ["hf-llama", "hf-vit", "hf-gpt2", "hf-bert"])
def test_held_rows_are_a_lower_bound_of_the_plans_accounting(name: str) -> None:
    """Random assignments on 2x2x2: the largest held row never exceeds the plan's largest transient, nor the saved
    bytes the rows add (copies) the plan's saved bytes (where the formulas' own do not already exceed the plan's:
    their decision-wide recompute rows can, which the rows leave as they are), and the rows rise above the
    formulas' transient in some (they see the gradients the formulas leave out). HF ViT: its first layer norm saves the layer's input, which a
    checkpointed layer keeps (nothing recomputed); HF GPT-2 (the built-in): a dropout after the MLP projection,
    in its decision, saves after the op its row is at (a row counting it claimed a slower plan optimal)."""
    from zoo import ZOO, build

    ex = build(name) if name in ZOO else get_example(name)
    graph = capture(ex.model, ex.example_inputs, name=name)
    hw = load_profile("a100-80gb")
    built = build_problem(graph, candidate_meshes(8, 8)[-1], hw, 10**12, device=hw.device)
    ip = IndexedProblem(built.problem)
    assert ip.held
    rng = random.Random(0)
    above = 0
    for _ in range(16):
        choice = [rng.randrange(n) for n in ip.sizes]
        ckpt = [b for b in range(len(ip.block_names)) if rng.random() < 0.5]
        held = held_bytes(ip, choice, ckpt)
        _, peak, parts = evaluate_indexed(ip, choice, ckpt)
        formulas = parts["transient_bytes"]
        sol = Solution(status="feasible", choice=dict(zip(ip.names, choice)), checkpointed=[ip.block_names[b] for b in ckpt])
        plan = assemble_plan(graph, built, sol, hw, budget_bytes=10**12, device=hw.device, bytes_per_param=16,
                             checkpointing=True, schemes=None)
        assert held <= max(plan.predicted.transient_bytes, formulas)
        # the saved bytes it adds (copies, less what may be counted twice): at most what the plan counts beyond them
        added = held_peak(ip, choice, ckpt) - peak - max(0, held - formulas)
        base = plan.predicted.model_state_bytes + plan.predicted.activation_bytes
        assert added <= max(0, base - (peak - formulas))
        above += held > formulas
    assert above > 0


def test_a_saved_view_counts_as_the_storage_it_views_as_in_the_plan() -> None:
    """HF BERT's position embedding saves its slice of the position-id buffer: the formulas count the slice, the plan
    the buffer it views (`planner.plans.assemble`). The rows add exactly that difference where the embedding takes it
    as it flows (on 64 ranks, 8x8, at the smallest budget the plan refused the held ILP's answer for these 256 B,
    and its bound stayed 12 % below the plan)."""
    from zoo import build

    ex = build("hf-bert")
    graph = capture(ex.model, ex.example_inputs, name="hf-bert")
    hw = load_profile("a100-80gb")
    built = build_problem(graph, candidate_meshes(8, 8)[-1], hw, 10**12, device=hw.device)
    ip = IndexedProblem(built.problem)
    views = {ip.names[v]: nbytes for v, nbytes, _ in ip.held_less if nbytes.min() < 0}
    assert list(views) == ["embedding_2"]
    v = ip.names.index("embedding_2")
    for c in range(ip.sizes[v]):
        choice = [0] * ip.n
        choice[v] = c
        sol = Solution(status="feasible", choice=dict(zip(ip.names, choice)), checkpointed=[])
        plan = assemble_plan(graph, built, sol, hw, budget_bytes=10**12, device=hw.device, bytes_per_param=16,
                             checkpointing=True, schemes=None)
        saved = next(a.cost.saved_bytes for a in plan.assignments if a.node == "embedding_2")
        assert saved - int(ip.saved[v][c]) == -int(views["embedding_2"][c])


@pytest.mark.parametrize("mesh", [0, 1])
def test_without_checkpointing_the_held_peak_never_exceeds_the_plans_bound(mesh: int) -> None:
    """Whatever the choices, with no block checkpointed (where the formulas' recompute rows are an upper bound), the
    peak the flat ILP with held rows counts is at most the plan's bound: its bounds are bounds of the plan's accounting.
    A saved view of a storage an earlier decision of the block may save counts once in the plan: HF BERT's q, k and
    v read the layer norm's output behind an identity dropout (on 64(x) the rows counted 195-261 KB beyond the plan
    in all 12 assignments here, on 8x8 in some), as HF GPT-NeoX's attention matmul saves softmax's output behind a
    p=0 dropout and v, a slice of the fused q/k/v projection (bench's tiny GPT-NeoX, 4x4x4, 1.25x its smallest
    budget: a held proof's 'optimum' 2.5187 ms stood above a 2.5085 ms plan that fits)."""
    from zoo import build

    ex = build("hf-bert")
    graph = capture(ex.model, ex.example_inputs, name="hf-bert")
    hw = load_profile("a100-80gb")
    built = build_problem(graph, candidate_meshes(64, 8)[mesh], hw, 10**12, device=hw.device)
    ip = IndexedProblem(built.problem)
    rng = random.Random(0)
    for _ in range(12):
        choice = [rng.randrange(n) for n in ip.sizes]
        sol = Solution(status="feasible", choice=dict(zip(ip.names, choice)), checkpointed=[])
        plan = assemble_plan(graph, built, sol, hw, budget_bytes=10**12, device=hw.device, bytes_per_param=16,
                             checkpointing=True, schemes=None)
        assert held_peak(ip, choice, []) <= plan.predicted.bound_bytes


def _gpt_tiny(world: int) -> tuple:
    ex = get_example("gpt-tiny")
    graph = capture(ex.model, ex.example_inputs, name="gpt-tiny")
    hw = load_profile("a100-80gb")
    built = build_problem(graph, candidate_meshes(world, 8)[-1], hw, 10**12, device=hw.device)
    return graph, hw, built, IndexedProblem(built.problem)


def _plan(graph, hw, built, ip: IndexedProblem, choice: list[int]):
    sol = Solution(status="feasible", choice=dict(zip(ip.names, choice)), checkpointed=[])
    return assemble_plan(graph, built, sol, hw, budget_bytes=10**12, device=hw.device, bytes_per_param=16,
                         checkpointing=True, schemes=None)


@pytest.mark.parametrize(("name", "world"), [("gpt-tiny", 8), ("gpt-tiny", 64), ("hf-opt", 64)])
def test_without_checkpointing_the_held_rows_count_the_saved_bytes_as_the_plan(name: str, world: int) -> None:
    """gpt-tiny (2x2x2 and 4x4x4) and HF OPT (4x4x4), random assignments, no block checkpointed: the formulas' saved
    bytes with the held rows' copies and less what they count twice are the plan's activation bytes, exactly.
    gpt-tiny: attention's second matmul saves v, which the q/k/v projection saves under some choices only: taken off
    where its choice does (before, off whatever the choice, under in all of them; the held ILP's 2.7648 ms answer on
    4x4x4 at 1.5x the smallest budget counted 4,096 B below the plan, and its bound stayed 1.96 % below the 2.9380 ms
    plan, now proven). HF OPT: q, k and v each save the layer norm's output, one storage only where it reaches them
    as it is made; converted, each keeps a copy of its own (taken off where an earlier one saved it, the rows were
    1-5 KiB under the plan in 10 of these 12; the held ILP's 2.4474 ms answer at 1.5x the smallest budget 8 KiB
    under, refused by the plan, and the plan 2.4780 ms 1.24 % unproven, now proven)."""
    from zoo import ZOO, build

    ex = build(name) if name in ZOO else get_example(name)
    graph = capture(ex.model, ex.example_inputs, name=name)
    hw = load_profile("a100-80gb")
    built = build_problem(graph, candidate_meshes(world, 8)[-1], hw, 10**12, device=hw.device)
    ip = IndexedProblem(built.problem)
    assert any(where for _, _, where in ip.held_less)
    rng = random.Random(0)
    for _ in range(12):
        choice = [rng.randrange(n) for n in ip.sizes]
        saved = evaluate_indexed(ip, choice, [])[2]["saved_bytes"]
        saved += sum(int(nbytes[choice[u], choice[v]]) for u, v, nbytes in ip.held_saved)
        saved -= sum(int(nbytes[choice[v]]) for v, nbytes, where in ip.held_less
                     if all(any(marks[choice[u]] for u, marks in clause) for clause in where))
        assert saved == _plan(graph, hw, built, ip, choice).predicted.activation_bytes


def test_a_waiting_gradient_counts_where_any_passthrough_on_the_ops_way_to_it_breaks() -> None:
    """gpt-tiny on 2x2x2: at the MLP projection's backward the residual stream's gradient waits beside it, one storage
    with the projection's output gradient only where the projection hands it to the dropout and the dropout to the
    residual add unchanged. Where the projection's reaches it as it flows (no conversion into it), the rows at its
    decision count what the plan counts there (before, only the projection's own passthrough was looked at: 32 KiB
    short where the dropout's broke, and the held ILP's 0.3592 ms answer at 2x the smallest budget was refused)."""
    graph, hw, built, ip = _gpt_tiny(8)
    op = "transformer_h_1_mlp_c_proj"
    v = ip.names.index(built.decision_of[op])
    rng = random.Random(0)
    checked = 0
    for _ in range(16):
        choice = [rng.randrange(n) for n in ip.sizes]
        plan = _plan(graph, hw, built, ip, choice)
        if any(r.dst == op for r in plan.redistributions):
            continue
        rows = [row.value(choice) for row in ip.held if row.node == v and not row.recomputation]
        there = next(a.cost.transient_bytes for a in plan.assignments if a.node == op)
        assert max([int(ip.transient[v][choice[v]]), *rows]) == there
        checked += 1
    assert checked


@pytest.mark.parametrize("name", ["hf-opt", "gpt-tiny"])
def test_a_conversion_into_an_op_of_a_block_not_checkpointed_counts_without_what_the_op_saves(name: str) -> None:
    """Random assignments on 8(x), no block checkpointed: what the op saves is not alive beside a conversion into it
    (the plan takes it off; a checkpointed block's recomputation keeps it), so the flat ILP with held rows counts
    the conversion's working set less it (`ProblemEdge.transient_bytes_unckpt`). The held peak never exceeds the
    plan's bound (gpt-tiny: it did in 6 of 30, up to 114,688 B, the formulas' conversion into the MLP projection
    counted whole), and equals it in half of them at least (HF OPT: none before, 99 KB short on average)."""
    from zoo import ZOO, build

    ex = build(name) if name in ZOO else get_example(name)
    graph = capture(ex.model, ex.example_inputs, name=name)
    hw = load_profile("a100-80gb")
    built = build_problem(graph, candidate_meshes(8, 8)[0], hw, 10**12, device=hw.device)
    ip = IndexedProblem(built.problem)
    rng = random.Random(0)
    equal = 0
    for _ in range(12):
        choice = [rng.randrange(n) for n in ip.sizes]
        bound = _plan(graph, hw, built, ip, choice).predicted.bound_bytes
        assert held_peak(ip, choice, []) <= bound
        equal += held_peak(ip, choice, []) == bound
    assert equal >= 6


@pytest.mark.parametrize("name", ["mlp", "hf-opt"])
def test_the_optimizer_steps_row_counts_what_the_plan_counts_beside_the_states(name: str) -> None:
    """Random assignments on 8(x) and 2x2x2: the states and what the optimizer step holds beside them, as the held
    rows count them (`Problem.held_step`), are the plan's states plus its optimizer bytes, exactly (one definition:
    `cost_models.optimizer`)."""
    from zoo import ZOO, build

    ex = build(name) if name in ZOO else get_example(name)
    graph = capture(ex.model, ex.example_inputs, name=name)
    hw = load_profile("a100-80gb")
    for mesh in candidate_meshes(8, 8)[:2]:
        built = build_problem(graph, mesh, hw, 10**12, device=hw.device)
        ip = IndexedProblem(built.problem)
        summed, per, fixed = ip.held_step
        rng = random.Random(0)
        for _ in range(6):
            choice = [rng.randrange(n) for n in ip.sizes]
            step = [int(nbytes[c]) for nbytes, c in zip(per, choice)]
            counted = sum(int(ip.state[v][c]) for v, c in enumerate(choice)) + fixed + (sum(step) if summed else max(step))
            predicted = _plan(graph, hw, built, ip, choice).predicted
            assert counted == predicted.model_state_bytes + predicted.optimizer_bytes


def test_at_the_mlps_smallest_budget_the_held_flat_ilp_finds_a_plan_that_fits_and_proves_it() -> None:
    """The built-in MLP on 8 ranks at its smallest budget (178,728 B): the least-memory plan (0.5753 ms) had no
    bound; the held flat ILP over every option, with the optimizer step's row (it binds there: the states, AdamW's
    foreach temporaries and the caller's batch), finds 0.3609 ms on 2x2x2, which the plan's accounting fits at
    exactly the budget, and proves it (`refine.held_exact`). Without the step row its answers were 120-280 B over."""
    from planner import plan

    ex = get_example("mlp")
    graph = capture(ex.model, ex.example_inputs, name="mlp")
    p = plan(graph, 178_728, world_size=8, hardware="a100-80gb", workers=1)
    assert p.predicted.bound_bytes <= 178_728
    assert p.predicted.step_time_s * 1e3 == pytest.approx(0.3609, abs=1e-4)
    assert p.solver.status == "optimal"


def test_the_held_ilps_optimum_at_gpt_tinys_smallest_budget_is_the_plan() -> None:
    """gpt-tiny on 8 ranks at its smallest budget (453,392 B), mesh (8,): the held rows count the MLP projection's
    output gradient beside its block's forward re-run where either way to the residual stream's breaks (the dropout
    after it, or the residual reaching the block's last add converted: `problem.Apart` with two conditions), and the
    re-run's conversion into that add. Their flat ILP's optimum, 1.8617 ms, is the plan, proven. Before, they saw
    only the projection's own way: the ILP's 1.7195 ms was 22,640 B over by the plan, and the answer was 2.1002 ms
    found under a tightened budget, 18 % from that bound."""
    from planner import plan

    ex = get_example("gpt-tiny")
    graph = capture(ex.model, ex.example_inputs, name="gpt-tiny")
    p = plan(graph, 453_392, world_size=8, hardware="a100-80gb", workers=1, meshes=["8"])
    assert p.predicted.bound_bytes == 451_456
    assert p.solver.status == "optimal" and p.predicted.step_time_s * 1e3 == pytest.approx(1.8617, abs=1e-4)


def test_a_least_memory_plan_with_no_bound_of_its_own_reports_the_fastest_assignments(monkeypatch) -> None:
    """Where the held flat ILP does not run (over four blocks or EXACT_FLAT_PAIRS: GPT-3 175B on 8 ranks, HF GPT-2
    on 64, at their smallest budgets), the least-memory plan had no bound (gap NaN); no plan is faster than the
    fastest assignment, memory aside (`solve.fastest_bound`), which it now reports. The built-in MLP on 8 ranks at
    its smallest budget with the held ILP left out: 0.5753 ms, bounded by 2x2x2's fastest plan."""
    from planner import plan
    from planner.plans import meshes

    monkeypatch.setattr(meshes, "held_exact", lambda *args, **kwargs: None)
    ex = get_example("mlp")
    graph = capture(ex.model, ex.example_inputs, name="mlp")
    p = plan(graph, 178_728, world_size=8, hardware="a100-80gb", workers=1)
    assert p.solver.status == "feasible" and 0 < p.solver.gap < 1 and "fastest assignment" in p.solver.message
    fastest = plan(graph, 1 << 40, world_size=8, hardware="a100-80gb", workers=1, meshes=[p.mesh])
    assert fastest.solver.status == "optimal"
    assert p.solver.bound == pytest.approx(fastest.solver.objective, rel=1e-5)  # (its priced bound, within 1e-6)
    assert p.solver.bound <= fastest.solver.objective


@pytest.mark.parametrize(("name", "samples", "least"), [("hf-gpt2", 16, 13), ("hf-llama", 24, 10)])
def test_at_the_recomputation_the_rows_count_what_the_plan_counts(name: str, samples: int, least: int) -> None:
    """hf-gpt2 (the built-in, transformers' GPT-2) and zoo HF LLaMA on 2x2x2, every block checkpointed, random
    assignments: the held peak never exceeds the plan's bound and equals it in `least` of them.

    hf-gpt2: the MLP dropout's output gradient waits through its block's recomputation beside the residual stream's,
    one storage with it only where the residual add hands it on unchanged; the rows at the recomputation count it
    where that passthrough breaks, as the plan does (none of 16 equal before: 8 KiB short at the MLP projection; the
    held ILP's 1.1594 ms answer at its smallest budget was refused). Both: an op's own buffer and a view of its output
    are two storages the recomputation makes, not one (hf-gpt2: the MLP projection keeps its converted input, the
    GELU saves a view of the projection's output; 6 of 16 and 5 of 24 equal while the rows counted the larger only)."""
    from zoo import ZOO, build

    ex = build(name) if name in ZOO else get_example(name)
    graph = capture(ex.model, ex.example_inputs, name=name)
    hw = load_profile("a100-80gb")
    built = build_problem(graph, candidate_meshes(8, 8)[-1], hw, 10**12, device=hw.device)
    ip = IndexedProblem(built.problem)
    every = list(range(len(ip.block_names)))
    rng = random.Random(0)
    equal = 0
    for _ in range(samples):
        choice = [rng.randrange(n) for n in ip.sizes]
        sol = Solution(status="feasible", choice=dict(zip(ip.names, choice)), checkpointed=list(ip.block_names))
        bound = assemble_plan(graph, built, sol, hw, budget_bytes=10**12, device=hw.device, bytes_per_param=16,
                              checkpointing=True, schemes=None).predicted.bound_bytes
        assert held_peak(ip, choice, every) <= bound
        equal += held_peak(ip, choice, every) == bound
    assert equal >= least
