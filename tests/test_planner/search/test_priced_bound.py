"""The priced search's lower bound at tight budgets: the raised max-term floor against enumeration, its
range search against a plain scan, and the bound against the exact optimum."""


import numpy as np
import pytest
from synthetic_problems import every_assignment, repeated_blocks

from planner.search.solve import brute_force, solve
from planner.search.solve.columns import PricedSolve
from planner.search.solve.decompose import decompose
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.priced_bound import banded_bound, golden_max, max_term_floor


@pytest.mark.parametrize("seed", range(6))
def test_max_term_floor_is_the_least_of_its_levels_that_passes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    levels = np.unique(rng.integers(0, 100, 30)).astype(float)
    least = np.sort(rng.integers(0, 200, len(levels)))[::-1].astype(float)  # non-increasing in the level
    table = dict(zip(levels.tolist(), least.tolist()))
    budget = int(rng.integers(50, 250))
    calls: list[float] = []

    def f(cap: float) -> float:
        calls.append(cap)
        return table[cap]

    scan = next((lv for lv in levels if table[lv] + lv <= budget), None)
    assert max_term_floor(levels, f, budget) == scan
    assert len(calls) <= len(levels)
    for most in (1, 2, 4):  # stopped early: still a floor (no passing level below it), never "none fits" wrongly
        calls.clear()
        early = max_term_floor(levels, f, budget, most)
        assert len(calls) <= most
        if scan is None:
            assert early is None or early in table
        else:
            assert early is not None and early <= scan


def test_raised_floor_is_below_every_fitting_assignments_max_term() -> None:
    """The floor (the least max term an assignment that fits can have) is a floor: no assignment that fits
    the budget has a smaller max term, checked against every assignment of small problems at tight
    budgets (between the least peak and 1.3 times it)."""
    raised = 0
    for seed in range(8):
        rng = np.random.default_rng(100 + seed)
        problem = repeated_blocks(rng, n_blocks=2, block_nodes=3, choices=2, residual=seed % 2 == 0, mem=1000)
        every = [(t, peak, top) for _, _, t, peak, top in every_assignment(IndexedProblem(problem))]
        least_peak = min(peak for _, peak, _ in every)
        for factor in (1.0, 1.1, 1.3):
            budget = int(least_peak * factor)
            ip = IndexedProblem(problem, budget)
            ps = PricedSolve(ip, decompose(ip))
            before = ps.floor
            ps._raise_floor()
            fits = [top for _, peak, top in every if peak <= budget]
            assert fits and min(fits) >= ps.floor >= before
            raised += ps.floor > before
    assert raised  # the raise does happen on some (else the test would check nothing new)


@pytest.mark.parametrize("seed", range(8))
def test_priced_bound_is_below_the_optimum_at_tight_budgets(seed: int) -> None:
    rng = np.random.default_rng(700 + seed)
    problem = repeated_blocks(rng, n_blocks=int(rng.integers(2, 4)), block_nodes=3, choices=2,
                              residual=seed % 2 == 0, checkpointing=True)
    least = solve(problem, budget=0, method="priced").min_feasible_budget
    for factor in (1.0, 1.2, 1.6):
        problem.budget_bytes = int(least * factor)
        ref, priced = brute_force(problem), solve(problem, method="priced")
        if ref.status != "optimal":
            continue
        assert priced.status in ("optimal", "feasible") and priced.peak_bytes <= problem.budget_bytes
        assert priced.bound <= ref.objective * (1 + 1e-9)
        assert priced.objective >= ref.objective * (1 - 1e-9)
        assert priced.objective * (1 - priced.gap) <= ref.objective * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_banded_bound_is_the_least_level_bound_once_every_range_is_split(seed: int) -> None:
    """A model of range bounds: each level has its own bound g, and a range's bound is the least g in it
    less a slack that grows with the range's width (a valid, looser bound). Split to single levels, the
    banded bound is min g; stopped early by its count, it is still at most min g and at least the whole
    range's bound; with a target below min g it stops as soon as every range reaches the target."""
    rng = np.random.default_rng(300 + seed)
    levels = np.unique(rng.integers(0, 1000, 40)).astype(float)
    g = dict(zip(levels.tolist(), rng.uniform(1.0, 2.0, len(levels)).tolist()))
    calls: list[tuple[float, float]] = []

    def range_bound(cap: float, floor: float, hint: object) -> tuple[float, object]:
        assert (hint is None) == (not calls)  # the first range has no enclosing one ...
        assert hint is None or hint[1] <= floor <= cap <= hint[0]  # ... and a part gets its whole's hint
        calls.append((cap, floor))
        inside = [v for lv, v in g.items() if floor <= lv <= cap]
        return min(inside) - 1e-3 * (cap - floor), (cap, floor)

    least = min(g.values())
    assert banded_bound(levels, range_bound, np.inf, 10_000) == pytest.approx(least)
    calls.clear()
    whole = range_bound(levels[-1], levels[0], None)[0]
    for most in (1, 3, 9):
        calls.clear()
        early = banded_bound(levels, range_bound, np.inf, most)
        assert len(calls) <= most and whole <= early <= least
    calls.clear()
    assert banded_bound(levels, range_bound, least - 0.5, 10_000) >= least - 0.5
    assert len(calls) < 2 * len(levels)


def test_banded_bound_stops_when_halving_does_not_lift_it() -> None:
    """Where no range lifts the bound (the max term does not bind), the search stops after `stall`
    halvings in a row instead of spending its whole count."""
    calls: list[float] = []

    def flat(cap: float, floor: float, hint: object) -> tuple[float, object]:
        calls.append(cap)
        return 1.0, None

    assert banded_bound(np.arange(100.0), flat, np.inf, 1_000, stall=3) == 1.0
    assert len(calls) == 1 + 2 * 3


def test_banded_bound_is_below_the_optimum_and_lifts_the_floor_bound() -> None:
    """On small problems at tight budgets, against every assignment: the bound by ranges of max-term
    levels never passes the optimum, and on some it is above the bound with the raised floor alone."""
    lifted = 0
    for seed in range(5):
        rng = np.random.default_rng(900 + seed)
        problem = repeated_blocks(rng, n_blocks=2, block_nodes=3, choices=3, residual=seed % 2 == 0,
                                  checkpointing=True)
        every = [(t, peak, top) for _, _, t, peak, top in every_assignment(IndexedProblem(problem))]
        least_peak = min(peak for _, peak, _ in every)
        for factor in (1.0, 1.15, 1.4):
            budget = int(least_peak * factor)
            optimum = min(t for t, peak, _ in every if peak <= budget)
            ip = IndexedProblem(problem, budget)
            ps = PricedSolve(ip, decompose(ip))
            ps._raise_floor()
            ps._lift_bound(ps.scale / 1e4, ps.scale * 1e4, np.inf, (0.0,))
            floor_bound = max(r.bound for r in ps.priced)
            banded = ps._banded(optimum, np.inf)
            assert banded <= optimum * (1 + 1e-9)
            lifted += banded > floor_bound * (1 + 1e-6) + 1e-12
    assert lifted


def test_golden_max_finds_the_maximum_of_a_concave_function() -> None:
    seen: dict[float, float] = {}

    def value(x: float) -> float:
        seen[x] = -(x - 1.7) ** 2
        return seen[x]

    golden_max(value, -5.0, 5.0, 30)
    assert max(seen, key=seen.get) == pytest.approx(1.7, abs=1e-4)
