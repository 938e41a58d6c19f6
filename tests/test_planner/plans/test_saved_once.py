"""A tensor several decisions of a block save in one layout is one storage (`planner.search.build.price_choices`):
the solver's problem counts it once, as the plan's accounting does; where an answer takes it in two layouts the
plan's accounting refuses it, and `plan_mesh` solves the problem that counts each decision's saves apart
(`BuiltProblem.apart`) instead of tightening the budget for every answer."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from synthetic_problems import repeated_blocks
from zoo import build

import planner.plans.meshes as meshes
from cost_models.hardware import load_profile
from cost_models.mesh import Mesh
from planner.plans.assemble import assemble_plan
from planner.plans.meshes import plan_mesh
from planner.search.build import build_problem
from planner.search.solve import Solution, evaluate, solve
from planner.trace.tracer import capture


def test_the_projections_of_a_llama_layer_count_their_common_input_once() -> None:
    """Zoo HF LLaMA on 2x2x2: q, k and v save the normalized input, gate and up theirs. For the fastest answer
    (no block checkpointed) the solver's saved bytes are the plan's activations but for the rotary tables;
    counted apart, they were 1 MiB more (what the later projections save again)."""
    ex = build("hf-llama")
    graph = capture(ex.model, ex.example_inputs, name="hf-llama")
    hw = load_profile("a100-80gb")
    budget = 2**30
    built = build_problem(graph, Mesh((2, 2, 2)), hw, budget, device=hw.device)
    assert built.apart is not None
    sol = solve(built.problem, budget=budget)
    assert sol.status == "optimal" and not sol.checkpointed
    plan = assemble_plan(graph, built, sol, hw, budget_bytes=budget, device=hw.device, bytes_per_param=16,
                         checkpointing=True, schemes=None)
    _, _, once = evaluate(built.problem, sol.choice, sol.checkpointed)
    _, _, apart = evaluate(built.apart[0], sol.choice, sol.checkpointed)
    # the one difference left: the rotary tables (cos and sin, 2,048 B each here), tensors from outside the
    # blocks that the second layer saves again; counted per block, so that identical layers stay identical
    assert once["saved_bytes"] - plan.predicted.activation_bytes == 2 * 2048
    assert apart["saved_bytes"] - plan.predicted.activation_bytes == 1_060_864
    # the first of a layer's q/k/v decisions counts the input, the others do not (per choice, in its layout)
    names = [n.name for n in built.problem.nodes]
    for d in built.decisions:
        k = names.index(d.name)
        for c, (mine, theirs) in enumerate(zip(built.problem.nodes[k].choices, built.apart[0].nodes[k].choices)):
            assert mine.saved_bytes <= theirs.saved_bytes, (d.name, c)


def _counted_once(apart, seed: int):
    """`apart` with the second node of every block saving nothing under its first two choices: as if an earlier
    decision of the block saved the same tensor (the answers that take them are refused where it does not)."""
    once = copy.deepcopy(apart)
    for node in once.nodes:
        if node.name.endswith(".op1"):
            node.choices = [dataclasses.replace(ch, saved_bytes=0) if c < 2 else ch for c, ch in enumerate(node.choices)]
    return once


def _built(once, apart) -> SimpleNamespace:
    """A built problem: `once` solved first, `apart` (or None) counting apart."""
    return SimpleNamespace(mesh="mesh", problem=once, step_problem=None, apart=None if apart is None else (apart, None))


def _accounting(apart):
    """The plan's accounting as `apart` counts: its peak."""
    def assemble(built, sol) -> SimpleNamespace:
        return SimpleNamespace(predicted=SimpleNamespace(bound_bytes=evaluate(apart, sol.choice, sol.checkpointed)[1]))
    return assemble


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_answers_refused_for_a_tensor_counted_once_are_solved_counted_apart(seed: int) -> None:
    apart = repeated_blocks(np.random.default_rng(seed), n_blocks=4, block_nodes=4, choices=3, budget_fraction=0.7)
    once = _counted_once(apart, seed)
    budget = apart.budget_bytes
    best = solve(apart, budget=budget)  # the fastest answer the plan's accounting (here: counted apart) fits
    assert best.status == "optimal"
    first = solve(once, budget=budget)
    assert evaluate(apart, first.choice, first.checkpointed)[1] > budget  # counted once, its answer is refused

    def planned(with_apart: bool):
        built = _built(once, apart if with_apart else None)
        return plan_mesh("mesh", lambda _: built, _accounting(apart), budget, solver="highs")

    got = planned(with_apart=True)
    assert got.apart and got.plan.predicted.bound_bytes <= budget
    assert got.objective == pytest.approx(best.objective, rel=1e-9)
    tightened = planned(with_apart=False)  # the budget tightened for every answer instead
    assert tightened.plan is None or tightened.objective > best.objective * (1 + 1e-9)


def test_a_model_of_many_blocks_is_solved_counted_apart_first() -> None:
    """More than `_ONCE_BLOCKS` repeated blocks: the problem counting apart is the one solved (on LLaMA-3-8B the
    answers counted once take q's and k/v's input in two layouts on every mesh, so it was solved anyway)."""
    apart = repeated_blocks(np.random.default_rng(0), n_blocks=6, block_nodes=4, choices=3, budget_fraction=0.7)
    once = _counted_once(apart, 0)
    assert len(apart.blocks) > meshes._ONCE_BLOCKS
    budget = apart.budget_bytes
    built = _built(once, apart)
    got = plan_mesh("mesh", lambda _: built, _accounting(apart), budget, solver="highs")
    assert got.apart and got.plan.predicted.bound_bytes <= budget
    assert got.objective == pytest.approx(solve(apart, budget=budget).objective, rel=1e-9)


def test_the_solve_counting_apart_is_given_the_answer_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_counted_apart` hands the answer that fits to the solve counting apart (`known`), with its figures as that
    problem counts them: its refinements then search only for faster answers. It returns that solve's answer
    only where faster (here the optimum counted apart), and nothing where the answer it was given is that optimum."""
    apart = repeated_blocks(np.random.default_rng(0), n_blocks=4, block_nodes=4, choices=3, budget_fraction=0.7)
    once = _counted_once(apart, 0)
    budget = apart.budget_bytes
    best = solve(apart, budget=budget)
    slower = solve(apart, budget=best.peak_bytes - 1)  # fits the budget too, and is slower
    assert slower.status in ("optimal", "feasible") and slower.objective > best.objective
    slower.status, slower.bound, slower.gap = "feasible", float("nan"), float("nan")  # nothing proven at `budget`
    given = []
    solved = meshes.solve

    def recording(problem, **options):
        given.append(options.get("known"))
        return solved(problem, **options)

    monkeypatch.setattr(meshes, "solve", recording)
    built = _built(once, apart)
    got = meshes._counted_apart(built, _accounting(apart), budget, slower, beaten=None, solver="highs")
    known = given[-1]
    assert known.choice == slower.choice and known.checkpointed == slower.checkpointed
    assert (known.objective, known.peak_bytes) == evaluate(apart, slower.choice, slower.checkpointed)[:2]
    assert got is not None and got.apart and got.objective == pytest.approx(best.objective, rel=1e-9)
    assert meshes._counted_apart(built, _accounting(apart), budget, best, beaten=None, solver="highs") is None


def test_an_answer_proven_optimal_counted_once_is_not_solved_again_counted_apart(monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    """The problem counting apart restricts the one counting once: where the first solve's answer that fits is proven
    optimal counted once, no answer counted apart is faster, and `_counted_apart` solves nothing (HF LLaMA, 64 ranks,
    2x its smallest budget: 12 s CPU spent proving the same answer again)."""
    apart = repeated_blocks(np.random.default_rng(0), n_blocks=4, block_nodes=4, choices=3, budget_fraction=0.7)
    once = _counted_once(apart, 0)
    budget = apart.budget_bytes
    first = solve(once, budget=budget)
    assert first.status == "optimal"
    solves = []
    monkeypatch.setattr(meshes, "solve", lambda problem, **options: solves.append(problem))
    assert meshes._counted_apart(_built(once, apart), _accounting(apart), budget, first, beaten=None,
                                 solver="highs") is None
    assert solves == []


def test_an_answer_counted_apart_keeps_the_bound_of_the_problem_counting_once() -> None:
    """The problem counting apart restricts the one counting once (it counts more for some answers), so its bound
    may lie above the optimum counted once: `_counted_apart`'s answer reports the lesser of the two bounds (the
    first solve's here: its optimum), not proven optimal where that opens the gap, and its plan says so."""
    apart = repeated_blocks(np.random.default_rng(0), n_blocks=4, block_nodes=4, choices=3, budget_fraction=0.7)
    once = _counted_once(apart, 0)
    budget = apart.budget_bytes
    best = solve(apart, budget=budget)
    lowest = solve(once, budget=budget)  # counted once: faster, refused by the plan's accounting
    assert best.status == "optimal" and lowest.status == "optimal" and lowest.objective < best.objective * (1 - 1e-3)
    slower = solve(apart, budget=best.peak_bytes - 1)
    slower.status = "feasible"  # at `budget`: proven no nearer than the bound below
    slower.bound, slower.gap = lowest.objective, (slower.objective - lowest.objective) / slower.objective
    got = meshes._counted_apart(_built(once, apart), _solver_block(apart), budget, slower, beaten=None, solver="highs")
    assert got is not None and got.objective == pytest.approx(best.objective, rel=1e-9)
    assert got.answer.bound == lowest.objective and got.answer.status == "feasible"
    assert got.plan.solver.bound == lowest.objective and got.plan.solver.status == "feasible"
    assert got.plan.solver.gap == pytest.approx((best.objective - lowest.objective) / best.objective, rel=1e-9)
    assert "counting a tensor several decisions save once" in got.plan.solver.message
    # the first solve stopped at its first refused answer, without one that fits and with a weak bound: a solve
    # counting once from the answer (`_once_bound`) raises it to that problem's optimum, the best any bound can be
    slower = Solution.beaten_by_elsewhere(0.0, 0.0)
    weak = meshes._counted_apart(_built(once, apart), _solver_block(apart), budget, slower, beaten=None, solver="highs")
    assert weak.answer.bound == pytest.approx(lowest.objective, rel=1e-9) and weak.answer.status == "feasible"


def _solver_block(apart):
    """`_accounting` with the plan's solver block (`_PlanAccount.plan` sets it)."""
    def assemble(built, sol) -> SimpleNamespace:
        return SimpleNamespace(predicted=SimpleNamespace(bound_bytes=evaluate(apart, sol.choice, sol.checkpointed)[1]),
                               solver=None)
    return assemble
