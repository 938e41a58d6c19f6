"""A tied head's copy of the embedding weight: the solver's problem and the plan count the same bytes
(`planner.search.tied`, one definition).

HF GPT-2 (tied lm_head) on 8 ranks: for every pair of (embedding choice, head choice), the saved bytes on
the problem's edge from the embedding's decision to the head's are the head's copy, as the assembled plan
counts it in the head's saved activations; the edge holds no working set. Some pairs hold a copy (1d: the
head's vocab split of the hidden-split embedding). And an answer's peak by the solver's formulas counts
the copy as the plan's bound does: an answer that holds one is not sent back for it.
"""

from __future__ import annotations

from cost_models.hardware import load_profile
from cost_models.mesh import Mesh
from planner.models.hf_gpt2 import build_hf_gpt2
from planner.plans.assemble import _tied_copies, assemble_plan
from planner.search.build import build_problem
from planner.search.solve import evaluate, solve
from planner.search.tied import copy_bytes, tied_uses
from planner.trace.tracer import capture


def test_the_problem_and_the_plan_count_the_same_copy() -> None:
    model, inputs = build_hf_gpt2(seed=0)
    graph = capture(model, inputs, name="hf-gpt2")
    (use,) = tied_uses(graph)
    built = build_problem(graph, Mesh((8,)), load_profile("cpu-gloo"), 1 << 30, device="cpu")
    home, head = built.decision_of[use.home], built.decision_of[use.user]
    (edge,) = [e for e in built.problem.edges if (e.src, e.dst) == (home, head)]
    assert edge.transient_bytes is None
    choice = {d.name: 0 for d in built.decisions}
    copies = 0
    for i in range(edge.saved_bytes.shape[0]):
        for j in range(edge.saved_bytes.shape[1]):
            choice[home], choice[head] = i, j
            copy = _tied_copies(graph, built, built.strategy_of(choice)).get(use.user, 0)
            assert edge.saved_bytes[i, j] == copy, (i, j)
            copies += copy > 0
    assert copies > 0


def test_a_plan_holding_a_copy_is_counted_as_the_bound_counts_it() -> None:
    """The fastest plan on 1d holds the copy; the solver's peak and the plan's bound differ by exactly the
    terms the solver's formulas leave to the plan (none here: nothing checkpointed, no conversion beside a
    saved tensor), so the answer fits at its own bound in one round."""
    model, inputs = build_hf_gpt2(seed=0)
    graph = capture(model, inputs, name="hf-gpt2")
    (use,) = tied_uses(graph)
    hw = load_profile("cpu-gloo")
    built = build_problem(graph, Mesh((8,)), hw, 1 << 30, device="cpu", schemes=frozenset({"1d_col", "1d_row"}))
    sol = solve(built.problem)
    pick = built.strategy_of(sol.choice)
    copy = _tied_copies(graph, built, pick).get(use.user, 0)
    assert copy > 0 and not sol.checkpointed
    parts = evaluate(built.problem, sol.choice, sol.checkpointed)[2]
    plan = assemble_plan(graph, built, sol, hw, budget_bytes=1 << 30, device="cpu", bytes_per_param=16,
                         checkpointing=True, schemes=["1d_col", "1d_row"])
    assert parts["saved_bytes"] == plan.predicted.activation_bytes


def test_a_head_that_gathers_its_weight_again_in_backward_holds_the_copy() -> None:
    """3d_allreduce with weight_shard gathers the weight in forward and again in backward: it saves its
    stored shard, which for a tied head is the converted copy (`planner verify` on HF GPT-2, 2x2x2: 16,384 B
    saved beyond the plan when the copy was left out). Whole for every (embedding, head) pair whose
    layouts differ; a head that keeps its gathered weight holds none."""
    model, inputs = build_hf_gpt2(seed=0)
    graph = capture(model, inputs, name="hf-gpt2")
    (use,) = tied_uses(graph)
    mesh = Mesh((2, 2, 2))
    built = build_problem(graph, mesh, load_profile("cpu-gloo"), 1 << 30, device="cpu")
    home = graph.node(use.home)
    seen = {"regather": 0, "keeps": 0}
    for j, head in enumerate(built.strategies[use.user]):
        cost = built.costs[use.user][j]
        phases = {c.phase for c in cost.collectives if c.tag == "weight"}
        if "forward" not in phases:
            continue
        lay = dict(head.params)["weight"]
        for i, emb in enumerate(built.strategies[use.home]):
            if dict(emb.params).get("weight") == lay:
                continue
            got = copy_bytes(use, home, emb, head, cost, mesh)
            if "backward" in phases:
                assert got == lay.local_numel(use.param.shape, mesh) * 4 > 0, (i, j)
                seen["regather"] += 1
            else:
                assert got == 0, (i, j)
                seen["keeps"] += 1
    assert seen["regather"] > 0 and seen["keeps"] > 0
