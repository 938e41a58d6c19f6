"""The flat ILP on problems whose blocks do not decompose (T5's shape: every decoder block also reads the
encoder output): its priced MIP start, and its work limit, which stops the search with the start (or
better) and an honest gap instead of running for minutes."""

import numpy as np
import pytest
from synthetic_problems import encoder_decoder

from planner.search.solve import brute_force, driver, evaluate, solve
from planner.search.solve.decompose import NotDecomposable, decompose
from planner.search.solve.driver import solve_built
from planner.search.solve.flat_start import priced_starts
from planner.search.solve.ilp import build_flat, flat_size
from planner.search.solve.indexed import IndexedProblem, fold_fixed_edges
from planner.search.solve.problem import Problem

SEEDS = range(10)


def _view(problem: Problem) -> IndexedProblem:
    """The solvers' view of `problem`, as `solve` makes it."""
    ip = IndexedProblem(problem)
    fold_fixed_edges(ip)
    return ip


def _small(seed: int) -> Problem:
    """9 nodes x 3 choices, 3 blocks: brute force enumerates it in a moment."""
    return encoder_decoder(np.random.default_rng(seed), budget_fraction=0.5 + 0.03 * seed)


def _medium(seed: int) -> Problem:
    """Too large for brute force and above the size where `solve` gives the flat ILP a start."""
    return encoder_decoder(np.random.default_rng(seed), enc_blocks=2, dec_blocks=3, block_nodes=3, choices=5,
                           budget_fraction=0.6)


def test_two_input_blocks_do_not_decompose() -> None:
    with pytest.raises(NotDecomposable, match="is fed by"):
        decompose(_view(_small(0)))


def test_priced_start_fits_and_its_figures_are_exact() -> None:
    found = 0
    for seed in SEEDS:
        problem = _small(seed)
        ref = brute_force(problem)
        start = priced_starts(_view(problem)).fastest
        if start is None:
            continue
        found += 1
        assert ref.status == "optimal", seed  # a start is an assignment that fits
        assert start.peak <= problem.budget_bytes
        names = [n.name for n in problem.nodes]
        time_s, peak, _ = evaluate(problem, dict(zip(names, start.choice)), [problem.blocks[b].name for b in start.ckpt])
        assert (time_s, peak) == (pytest.approx(start.time_s, rel=1e-12), start.peak)
        assert start.time_s >= ref.objective * (1 - 1e-12)
    assert found >= 4


def test_flat_ilp_from_the_start_matches_brute_force() -> None:
    for seed in SEEDS:
        problem = _small(seed)
        ip = _view(problem)
        start = priced_starts(ip).fastest
        sol = solve_built(ip, lambda mode, budget, ip=ip: build_flat(ip, mode, budget), solver="highs",
                          deadline=float("inf"), method="flat",
                          initial=None if start is None else (start.choice, start.ckpt))
        ref = brute_force(problem)
        assert sol.status == ref.status, seed
        if ref.status == "optimal":
            assert sol.objective == pytest.approx(ref.objective, rel=1e-9), seed
            assert sol.peak_bytes <= problem.budget_bytes


def test_medium_instance_is_solved_exactly_under_the_default_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = _medium(0)
    assert flat_size(_view(problem)) > 50  # solve() computes a start for it
    sol = solve(problem)
    assert sol.method == "flat"
    monkeypatch.setattr(driver, "WORK_LIMIT", None)
    exact = solve(problem)
    assert exact.status == "optimal"
    assert sol.status in ("optimal", "feasible")
    if sol.status == "optimal":
        assert sol.objective == pytest.approx(exact.objective, rel=1e-9)
    else:
        assert sol.objective >= exact.objective * (1 - 1e-9)
        assert sol.bound <= exact.objective * (1 + 1e-9)


def test_work_limit_keeps_the_start_and_reports_its_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = _medium(1)
    start = priced_starts(_view(problem)).fastest
    assert start is not None
    monkeypatch.setattr(driver, "WORK_LIMIT", 1)  # the fewest solver checkpoints HiGHS is given
    sol = solve(problem)
    assert sol.method == "flat" and sol.peak_bytes <= problem.budget_bytes
    assert sol.objective <= start.time_s * (1 + 1e-9)  # never worse than the start
    if sol.status == "feasible":
        assert "work limit" in sol.message
        assert sol.bound <= sol.objective
        assert sol.gap == pytest.approx((sol.objective - sol.bound) / sol.objective, rel=1e-3, abs=1e-6)
    else:
        assert sol.status == "optimal" and sol.gap == 0.0
    again = solve(problem)  # a count, not seconds: the same answer every time
    assert (again.choice, again.checkpointed, again.status) == (sol.choice, sol.checkpointed, sol.status)
