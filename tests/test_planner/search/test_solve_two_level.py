"""The two-level solve: exact against the flat ILP and brute force on repeated-block problems, its block
frontier against enumeration, walks of chosen points, per-layer mixing and where it does not apply."""

import itertools

import numpy as np
import pytest
from synthetic_problems import repeated_blocks

from planner.search.solve import Block, Choice, NotDecomposable, Problem, ProblemEdge, ProblemNode, brute_force, solve
from planner.search.solve.decompose import decompose
from planner.search.solve.frontier import (
    FrontierPoint,
    FrontierTooLarge,
    block_frontier,
    pareto_mask,
    undominated,
    undominated_rows,
)
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.two_level import _trail

# (blocks, nodes per block, choices per node): 2-6 identical blocks of 3-6 nodes with 2-4 choices
SHAPES = [(2, 6, 4), (6, 3, 2), (3, 4, 3), (4, 3, 3), (2, 5, 3), (5, 3, 2), (3, 3, 4), (2, 4, 4), (4, 4, 2), (3, 6, 2),
          (6, 4, 2), (2, 3, 3)]


def _instance(i: int) -> Problem:
    """SHAPES[i] as a chain (odd i) or residual DAG blocks (even i), checkpointing off for every 4th."""
    n_blocks, block_nodes, choices = SHAPES[i]
    rng = np.random.default_rng(2000 + i)
    return repeated_blocks(rng, n_blocks=n_blocks, block_nodes=block_nodes, choices=choices, residual=i % 2 == 0,
                           checkpointing=i % 4 != 3, budget_fraction=float(rng.uniform(0.3, 0.8)))


def test_two_level_matches_flat() -> None:
    statuses = []
    for i in range(len(SHAPES)):
        problem = _instance(i)
        flat = solve(problem, method="flat")
        two = solve(problem, method="two_level")
        assert two.method == "two_level"
        assert two.status == flat.status, i
        statuses.append(flat.status)
        if flat.status == "optimal":
            assert two.objective == pytest.approx(flat.objective, rel=1e-9, abs=0), i
            assert two.peak_bytes <= problem.budget_bytes
        else:
            assert two.min_feasible_budget == flat.min_feasible_budget, i
    assert statuses.count("optimal") >= 6 and statuses.count("infeasible") >= 3, statuses


@pytest.mark.parametrize("seed", range(4))
def test_two_level_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(3000 + seed)
    problem = repeated_blocks(rng, n_blocks=3, block_nodes=3, choices=2, residual=seed % 2 == 1,
                              budget_fraction=float(rng.uniform(0.3, 0.7)))
    ref, two = brute_force(problem), solve(problem, method="two_level")
    assert two.status == ref.status
    if ref.status == "optimal":
        assert two.objective == pytest.approx(ref.objective, rel=1e-9, abs=0)
    else:
        assert two.min_feasible_budget == ref.min_feasible_budget


def _enumerated(shape, checkpointing: bool) -> set:
    """Every internal assignment of the block, evaluated directly, Pareto-reduced per (p, q)."""
    rows: dict[tuple[int, int], list] = {}
    for p in range(shape.port_size):
        for choice in itertools.product(*[range(s) for s in shape.sizes]):
            for ckpt in ([False, True] if checkpointing else [False]):
                t = sum(shape.time[v][c] + (shape.recompute[v][c] if ckpt else 0) for v, c in enumerate(choice))
                t += sum(cost[choice[a], choice[b]] + (rec[choice[a], choice[b]] if ckpt else 0)
                         for a, b, cost, rec in shape.internal)
                t += sum(cost[p, choice[d]] + (rec[p, choice[d]] if ckpt else 0) for d, cost, rec in shape.from_port)
                state = sum(int(shape.state[v][c]) for v, c in enumerate(choice))
                saved = sum(int(shape.saved[v][c]) for v, c in enumerate(choice))
                work = [int(shape.transient[v][c]) for v, c in enumerate(choice)]
                # the recompute peak: activations recomputed up to a node (block order) beside its working set
                peak = max(int(np.cumsum([shape.saved[v][c] for v, c in enumerate(choice)])[v]) + work[v]
                           for v in range(len(choice)))
                add = state + (int(shape.input_bytes[p]) if ckpt else saved)
                q = choice[shape.out_pos]
                rows.setdefault((p, q), []).append((add, peak if ckpt else max(work), t))
    out = set()
    for (p, q), vals in rows.items():
        arr = np.array(vals, dtype=float)
        for a, m, t in arr[pareto_mask(arr)]:
            out.add((p, q, int(a), int(m), round(t, 12)))
    return out


@pytest.mark.parametrize("residual", [False, True])
def test_block_frontier_is_the_enumerated_pareto_set(residual: bool) -> None:
    problem = repeated_blocks(np.random.default_rng(7), n_blocks=2, block_nodes=4, choices=3, residual=residual)
    shape = decompose(IndexedProblem(problem)).classes[0].shape
    assert len(decompose(IndexedProblem(problem)).classes[0].blocks) == 2
    points = block_frontier(shape, checkpointing=True)
    got = {(pt.p, pt.q, pt.add_bytes, pt.max_bytes, round(pt.time_s, 12)) for pt in points}
    assert got == _enumerated(shape, True)
    assert len(got) == len(points)


def test_trail_orders_points_into_one_walk() -> None:
    arcs = [(0, 1, 10), (1, 1, 11), (1, 0, 12), (0, 0, 13), (0, 2, 14)]  # (p, q, id)
    order = _trail(arcs, start=0)
    assert sorted(order) == [10, 11, 12, 13, 14]
    by_id = {i: (p, q) for p, q, i in arcs}
    walk = [by_id[i] for i in order]
    assert walk[0][0] == 0 and all(a[1] == b[0] for a, b in zip(walk, walk[1:]))


def _mixing_problem() -> Problem:
    """4 one-node blocks; each saves 100 B unless checkpointed (keeps 10 B, recompute 1 s). The budget fits
    two un-checkpointed blocks, so the optimum checkpoints exactly two: different layers, different points."""
    nodes, blocks = [ProblemNode("x", [Choice(0.0, 0.0, 0, 0, 0)])], []
    edges = []
    for k in range(4):
        nodes.append(ProblemNode(f"L{k}", [Choice(1.0, 1.0, 0, 100, 0)], block=f"B{k}"))
        blocks.append(Block(f"B{k}", [f"L{k}"], "x" if k == 0 else f"L{k - 1}", [10], cls="layer"))
        edges.append(ProblemEdge("x" if k == 0 else f"L{k - 1}", f"L{k}", np.zeros((1, 1)), np.zeros((1, 1))))
    return Problem(nodes, edges, blocks, budget_bytes=2 * 100 + 2 * 10 + 100)


def test_per_layer_mixing() -> None:
    problem = _mixing_problem()
    for method in ("flat", "two_level"):
        sol = solve(problem, method=method)
        assert sol.status == "optimal" and len(sol.checkpointed) == 2
        assert sol.objective == pytest.approx(6.0) and sol.peak_bytes == 320


def _two_outputs() -> Problem:
    """Two blocks whose first node feeds a node outside: blocks with two output nodes."""
    rng = np.random.default_rng(3)
    problem = repeated_blocks(rng, n_blocks=2, block_nodes=3, choices=2, residual=False, budget_fraction=2.0)
    problem.edges.append(ProblemEdge("L0.op0", "head", np.ones((2, 2)) * 1e-3, np.zeros((2, 2))))
    return problem


def test_not_decomposable() -> None:
    problem = _two_outputs()
    with pytest.raises(NotDecomposable, match="several output nodes"):
        solve(problem, method="two_level")
    sol = solve(problem, method="auto")
    assert sol.method == "flat" and sol.objective == pytest.approx(brute_force(problem).objective, rel=1e-9)


def test_auto_picks_priced_for_many_identical_blocks() -> None:
    problem = repeated_blocks(np.random.default_rng(11), n_blocks=16, block_nodes=6, choices=4, residual=True)
    sol = solve(problem)
    exact = solve(problem, method="two_level")
    assert sol.method == "priced" and exact.status == "optimal"
    assert sol.peak_bytes <= problem.budget_bytes
    assert exact.objective * (1 - 1e-9) <= sol.objective and sol.objective * (1 - sol.gap) <= exact.objective * (1 + 1e-9)
    assert solve(repeated_blocks(np.random.default_rng(11), n_blocks=2, block_nodes=3, choices=2)).method == "flat"


def _wide_blocks(fan: int = 5, choices: int = 30) -> Problem:
    """embed -> 2 identical blocks -> head, each block a fan: its first op feeds `fan` ops that all feed its
    last, so all `fan` stay live together while the block is swept (choices**fan combinations at once)."""
    rng = np.random.default_rng(5)
    def options() -> list[Choice]:
        return [Choice(float(t), 0.1 * float(t), 100, int(b), int(b) // 2)
                for t, b in zip(rng.uniform(1e-3, 2e-3, choices), rng.integers(100, 1000, choices))]
    costs = [options() for _ in range(fan + 2)]
    nodes, edges, blocks, prev = [ProblemNode("embed", options())], [], [], "embed"
    for k in range(2):
        names = [f"L{k}.op{i}" for i in range(fan + 2)]
        nodes += [ProblemNode(name, list(costs[i]), block=f"L{k}") for i, name in enumerate(names)]
        edges.append(ProblemEdge(prev, names[0], np.zeros((choices, choices)), np.zeros((choices, choices))))
        for i in range(1, fan + 1):
            edges.append(ProblemEdge(names[0], names[i], np.full((choices, choices), 1e-4), np.zeros((choices, choices))))
            edges.append(ProblemEdge(names[i], names[-1], np.full((choices, choices), 1e-4), np.zeros((choices, choices))))
        blocks.append(Block(f"L{k}", names, prev, [100] * choices, cls="layer"))
        prev = names[-1]
    nodes.append(ProblemNode("head", options()))
    edges.append(ProblemEdge(prev, "head", np.zeros((choices, choices)), np.zeros((choices, choices))))
    return Problem(nodes, edges, blocks, 10**9)


def test_too_wide_a_block_is_refused_with_a_clear_error_not_allocated() -> None:
    """The Lagrangian bound's DP tensors span every choice combination held live at once (30**5 x port x
    levels here: terabytes); the two-level solve refuses such a block (HF LLaMA's layer on 2x2x2 was killed
    for memory) and names the way out, and the default solve of the same problem still answers."""
    problem = _wide_blocks()
    with pytest.raises(FrontierTooLarge, match="method='priced'"):
        solve(problem, budget=20_000, method="two_level")
    sol = solve(problem, budget=20_000)
    assert sol.status in ("optimal", "feasible") and sol.peak_bytes <= 20_000


def test_undominated_keeps_what_no_point_of_its_boundary_weakly_dominates() -> None:
    """`undominated` (and `undominated_rows`, what column sets are built from) against the definition, on
    points with many ties: per (p, q, checkpointed), the points no other one is at most in all three numbers
    (of equal ones the first), groups in the order first seen, points in order."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        k = int(rng.integers(1, 120))
        keys = rng.integers(0, 3, size=(k, 3))
        keys[:, 2] %= 2
        values = rng.integers(0, 4, size=(k, 3)).astype(float)
        points = [FrontierPoint(int(p), int(q), bool(c), int(a), int(m), float(t), (i,))
                  for i, ((p, q, c), (a, m, t)) in enumerate(zip(keys, values))]
        want = []
        for key in dict.fromkeys(map(tuple, keys.tolist())):
            mine = [i for i in range(k) if tuple(keys[i].tolist()) == key]
            want += [i for i in mine if not any(
                np.all(values[j] <= values[i]) and (np.any(values[j] < values[i]) or j < i) for j in mine if j != i)]
        assert undominated_rows(keys, values).tolist() == want
        assert [pt.choice[0] for pt in undominated(points)] == want
