"""A tensor that blocks read beside their input (`SharedInput`: LLaMA's rotary tables and mask) is kept
once while any of those blocks is checkpointed: the formulas count it so, and every exact solver agrees
with brute force on problems that have one."""

import copy

import numpy as np
import pytest
from synthetic_problems import repeated_blocks

from planner.search.solve import brute_force, evaluate, solve
from planner.search.solve.indexed import IndexedProblem, fold_shared_inputs


def _problem(seed: int, shared: list[int], loose: bool = False):
    """Budgets where nothing fits without checkpointing; `loose`: where some answers do."""
    rng = np.random.default_rng(7000 + seed)
    fraction = float(rng.uniform(0.95, 1.05) if loose else rng.uniform(0.3, 0.7))
    return repeated_blocks(rng, n_blocks=3, block_nodes=3, choices=2, residual=seed % 2 == 0, shared=shared,
                           budget_fraction=fraction)


def test_counted_once_while_any_reader_is_checkpointed() -> None:
    problem = _problem(0, [300, 120])
    bare = copy.copy(problem)
    bare.shared_inputs = []
    choice = {n.name: 0 for n in problem.nodes} | {"table": 1}

    def extra(ckpt: tuple[str, ...]) -> int:
        return evaluate(problem, choice, ckpt)[1] - evaluate(bare, choice, ckpt)[1]

    assert extra(()) == 0
    for ckpt in (("L0",), ("L2",), ("L0", "L1", "L2")):
        assert extra(ckpt) == 120  # the table's bytes under its choice, once
    problem.shared_inputs[0].blocks = ["L1"]  # read by L1 alone: the others keep nothing of it
    assert extra(("L0", "L2")) == 0 and extra(("L1",)) == 120


def _tabled(seed: int):
    """Odd seeds: a table with two choices; even: one choice, as HF's are (its node is the constant)."""
    return _problem(seed, [400, 150] if seed % 2 else [250])


def test_the_table_changes_the_optimum() -> None:
    """These instances are ones where counting the table matters (else the next test proves nothing)."""
    changed = 0
    for seed in range(6):
        problem = _tabled(seed)
        bare = copy.copy(problem)
        bare.shared_inputs = []
        with_table, without = brute_force(problem), brute_force(bare)
        changed += (with_table.status, with_table.objective) != (without.status, without.objective)
    assert changed >= 2


@pytest.mark.parametrize("seed", range(6))
def test_exact_solvers_match_brute_force(seed: int) -> None:
    problem = _tabled(seed)
    ref = brute_force(problem)
    for method in ("flat", "two_level"):
        got = solve(problem, method=method)
        assert got.status == ref.status, (seed, method)
        if ref.status == "optimal":
            assert got.objective == pytest.approx(ref.objective, rel=1e-9, abs=0), (seed, method)
            assert evaluate(problem, got.choice, got.checkpointed)[1] <= problem.budget_bytes
        else:
            assert got.min_feasible_budget == ref.min_feasible_budget, (seed, method)


@pytest.mark.parametrize("loose", [False, True])
def test_priced_answers_fit_with_the_shared_bytes(loose: bool) -> None:
    """The priced search prices blocks one by one: where nothing fits without checkpointing the shared
    bytes are charged to their node (`fold_shared_inputs`), otherwise left out of its prices (a relaxation);
    either way every answer is measured with them: what it returns fits, its bound is a lower bound."""
    folded = 0
    for seed in range(6):
        problem = _problem(seed, [400, 150], loose)
        view = IndexedProblem(problem)
        view.saved, view.shared = list(view.saved), list(view.shared)
        folded += fold_shared_inputs(view)
        ref = brute_force(problem)
        got = solve(problem, method="priced")
        if ref.status != "optimal":
            continue
        assert got.status in ("optimal", "feasible")
        assert evaluate(problem, got.choice, got.checkpointed)[1] <= problem.budget_bytes
        assert got.objective >= ref.objective * (1 - 1e-9)
        assert got.bound <= ref.objective * (1 + 1e-9)
    assert folded == (0 if loose else 6)
