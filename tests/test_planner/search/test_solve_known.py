"""`solve(known=...)`: an answer the caller knows to fit (`use_room`'s plan at a tighter budget) is never lost: the
answer returned is at least as fast, and the refinement searches only for answers faster than it (reduced-cost
fixing cuts every option that cannot beat it). And a refinement whose answer the caller's account does not fit
never displaces one it does; the flat ILP over the options that can beat the answer is solved again under a
budget tightened by what the account counted beyond the formulas, and its answer is the fastest that fits.

Random problems (two or three blocks), against brute force."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from synthetic_problems import every_assignment, repeated_blocks

import planner.search.solve.refine as refine_module
from planner.search.solve import Solution, brute_force, solve
from planner.search.solve.columns import PricedSolve
from planner.search.solve.decompose import decompose
from planner.search.solve.evaluate import evaluate_indexed
from planner.search.solve.indexed import IndexedProblem


def _problem(seed: int):
    rng = np.random.default_rng(900 + seed)
    return repeated_blocks(rng, n_blocks=3, block_nodes=3, choices=3, residual=seed % 2 == 0,
                           budget_fraction=float(rng.uniform(0.45, 0.8)))


@pytest.mark.parametrize("seed", [12, 42])
def test_a_known_answer_is_never_lost(seed: int, monkeypatch) -> None:
    problem = _problem(seed)
    ref = brute_force(problem)
    assert ref.status == "optimal"
    monkeypatch.setattr(refine_module.fixing, "prove", lambda *a, **k: None)  # no reduced-cost fixing ILP
    alone = solve(problem, method="priced")
    assert alone.objective > ref.objective * (1 + 1e-6)  # not vacuous: without it the answer is slower
    sol = solve(problem, method="priced", known=ref)
    assert sol.objective == pytest.approx(ref.objective, rel=1e-12) and sol.peak_bytes <= problem.budget_bytes
    assert sol.choice == ref.choice and "the caller's answer" in sol.message
    assert sol.bound <= sol.objective  # the search's own lower bound, which holds for every answer


@pytest.mark.parametrize("seed", [12, 42])
def test_the_refinement_from_a_known_answer_proves_it(seed: int) -> None:
    """With its usual work, the flat ILP over the options that can beat the known answer proves it optimal."""
    problem = _problem(seed)
    ref = brute_force(problem)
    sol = solve(problem, method="priced", known=ref)
    assert sol.status == "optimal" and sol.objective == pytest.approx(ref.objective, rel=1e-9)


@pytest.mark.parametrize("seed", [12, 42])
def test_a_refinement_the_account_does_not_fit_is_not_taken(seed: int, monkeypatch) -> None:
    """An account that does not fit anything faster than the priced answer (as where the plan counts bytes the
    formulas do not see): every faster answer the refinement finds is thrown away, the priced answer is kept, and
    the bounds the refinement proved still count (they hold for every answer, fitting or not)."""
    problem = _problem(seed)
    ref = brute_force(problem)
    with monkeypatch.context() as m:
        m.setattr(refine_module.fixing, "prove", lambda *a, **k: None)
        first = solve(problem, method="priced")  # slower than the optimum (above)
    seen: list[float] = []

    def account(s) -> int:
        seen.append(s.objective)
        return s.peak_bytes if s.objective >= first.objective * (1 - 1e-9) else problem.budget_bytes + 1

    sol = solve(problem, method="priced", account=account)
    assert account(sol) <= problem.budget_bytes
    assert sol.objective >= first.objective * (1 - 1e-9)
    assert min(seen) < first.objective  # a faster answer was found and refused: not vacuous
    assert sol.bound <= ref.objective * (1 + 1e-9)


@pytest.mark.parametrize("seed", [1, 4, 5, 6, 9])
def test_a_fixing_answer_the_account_does_not_fit_is_solved_again_tighter(seed: int, monkeypatch) -> None:
    """From a slow answer (the least-memory one, time T), with an account that counts X bytes beyond the formulas
    for every faster answer, X just enough that the optimum does not fit: the answer is the brute-force fastest
    of those faster than T that fit X below the budget (T itself where none does: seed 1), found by the ILP
    again under the budget tightened by what the account counted beyond the formulas. (X is a few percent of
    these budgets: the retry's limit, RETRY_SHRINK, is lifted here; at 0 the answer stays T.)"""
    rng = np.random.default_rng(seed)
    problem = repeated_blocks(rng, n_blocks=2, block_nodes=3, choices=3, residual=seed % 2 == 0,
                              budget_fraction=float(rng.uniform(0.5, 0.8)))
    ip = IndexedProblem(problem)
    budget = ip.budget
    search = PricedSolve(ip, decompose(ip))
    assert search.solve("highs", math.inf).status in ("optimal", "feasible")  # its bound search prices the options
    least = solve(problem, budget=0)
    slow, peak, _ = evaluate_indexed(ip, *ip.vectors(least.choice, least.checkpointed))
    assert peak <= budget
    out = Solution(status="feasible", choice=dict(least.choice), checkpointed=list(least.checkpointed),
                   objective=slow, peak_bytes=peak, gap=float("nan"))
    fitting = [(t, p) for _, _, t, p, _ in every_assignment(ip) if p <= budget]
    extra = budget - min(fitting)[1] + 1  # the optimum does not fit the account

    def over(s: Solution) -> int:
        return s.peak_bytes + (extra if s.objective < slow * (1 - 1e-9) else 0) - budget

    expected = min([t for t, p in fitting if t < slow * (1 - 1e-9) and p <= budget - extra] + [slow])
    monkeypatch.setattr(refine_module, "RETRY_SHRINK", 0.0)
    assert refine_module._fixed(search, ip, ip, "highs", math.inf, copy.copy(out), over, None).objective == slow
    monkeypatch.setattr(refine_module, "RETRY_SHRINK", 1.0)
    got = refine_module._fixed(search, ip, ip, "highs", math.inf, out, over, None)
    assert got.objective == pytest.approx(expected, rel=1e-9) and over(got) <= 0
    assert got.bound <= expected * (1 + 1e-9)  # no tightened ILP's bound is taken for the whole problem's
    if expected < slow:
        assert "tightened" in got.message
