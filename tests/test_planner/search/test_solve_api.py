"""solve()'s options: time limit, CBC and the fallback to it, argument errors, the progress line."""

import logging
import sys
import time

import numpy as np
import pytest
from synthetic_problems import every_assignment, random_problem, repeated_blocks

import planner.search.solve as solve_pkg
from planner.search.solve import SolverError, brute_force, evaluate, solve
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.milp import Progress


def _small(seed: int, fraction: float = 0.6):
    rng = np.random.default_rng(seed)
    return random_problem(rng, n_nodes=6, max_choices=3, n_blocks=2, budget_fraction=fraction)


def test_time_limit_gives_feasible_with_gap_or_a_clear_error() -> None:
    # 12 identical blocks of 8 ops x 10 choices: the flat ILP needs minutes to prove optimality
    problem = repeated_blocks(np.random.default_rng(0), n_blocks=12, block_nodes=8, choices=10, residual=False)
    sol = solve(problem, method="flat", time_limit=1.0)
    assert sol.status in ("feasible", "error")
    if sol.status == "feasible":
        # not proven: a positive gap (infinite when the stop came before any useful bound, as it can on a
        # loaded machine) and the reason in the message
        assert sol.gap > 0 and "stopped" in sol.message
        assert sol.peak_bytes <= problem.budget_bytes
        assert evaluate(problem, sol.choice, sol.checkpointed)[:2] == (sol.objective, sol.peak_bytes)
    else:
        assert "raise time_limit" in sol.message and not sol.choice


@pytest.mark.parametrize(("seed", "fraction"), [(1, 0.6), (2, 0.7), (4, 0.3)])
def test_cbc_finds_the_same_optimum(seed: int, fraction: float) -> None:
    problem = _small(seed, fraction)
    ref, sol = brute_force(problem), solve(problem, solver="cbc")
    assert sol.solver == "cbc" and sol.status == ref.status
    if ref.status == "optimal":
        assert sol.objective == pytest.approx(ref.objective, rel=1e-9)
    else:
        assert sol.min_feasible_budget == ref.min_feasible_budget


def test_missing_highspy_falls_back_to_cbc(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    problem = _small(1)
    monkeypatch.setitem(sys.modules, "highspy", None)  # `import highspy` now raises ImportError
    with caplog.at_level(logging.WARNING, logger="planner.search.solve.milp"):
        sol = solve(problem, solver="highs")
    assert "falling back to CBC" in caplog.text
    assert sol.solver == "cbc"
    assert sol.objective == pytest.approx(brute_force(problem).objective, rel=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [({"solver": "gurobi"}, "unknown solver"), ({"method": "greedy"}, "unknown method"),
     ({"time_limit": 0}, "time_limit must be > 0")],
)
def test_bad_options_raise_solver_error(kwargs: dict, words: str) -> None:
    with pytest.raises(SolverError, match=words):
        solve(_small(1), **kwargs)
    assert issubclass(SolverError, ValueError)


def test_progress_line_for_long_work(capsys: pytest.CaptureFixture) -> None:
    with Progress(True, "working", delay_s=0.05):
        time.sleep(0.3)
    err = capsys.readouterr().err
    assert "working ... (running)" in err and "working ... done in" in err
    with Progress(True, "quick", delay_s=5.0):
        pass
    with Progress(False, "off", delay_s=0.0):
        time.sleep(0.1)
    assert capsys.readouterr().err == ""


def test_solve_shows_progress_only_when_asked(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(solve_pkg, "PROGRESS_DELAY_S", 0.0)
    solve(_small(2), progress=False)
    assert capsys.readouterr().err == ""
    solve(_small(2), progress=True)
    assert "planner: flat solve of 6 nodes ... done in" in capsys.readouterr().err


def test_solve_tightens_by_what_the_account_counts_beyond_the_formulas() -> None:
    """solve(account=...): when the account (the assembled plan's bound, in plan_mesh) counts `extra`
    bytes the formulas do not see, the retry must ask for an answer `extra` below the budget, even when the
    first answer was well below the budget (tightening by the excess over the budget alone returned the
    same answer each round)."""
    problem = repeated_blocks(np.random.default_rng(3), n_blocks=4, block_nodes=4, choices=3, budget_fraction=0.7)
    budget = problem.budget_bytes
    first = solve(problem)
    slack = budget - first.peak_bytes
    assert first.status in ("optimal", "feasible") and slack > 64  # the answer is not at the budget
    extra = slack + 1  # the first answer no longer fits once the account's own bytes are counted
    measured: list[int] = []

    def account(sol) -> int:
        measured.append(sol.peak_bytes + extra)
        return measured[-1]

    sol = solve(problem, account=account)
    assert sol.status in ("optimal", "feasible") and sol.peak_bytes + extra <= budget
    # the first answer was retried (the refinement at the budget measures the answers of its proofs too)
    assert len(measured) >= 2 and measured[0] > budget
    assert problem.budget_bytes == budget  # the problem is not changed
    assert sol.objective == pytest.approx(solve(problem, budget=budget - extra).objective, rel=1e-9)


@pytest.mark.parametrize("seed", [33, 34, 38])
def test_an_answer_of_a_tightened_round_claims_only_the_bound_proven_at_the_budget(seed: int) -> None:
    """Where the account counts more than the formulas for some answers only (400 B wherever one node takes its
    first option), `solve` tightens its budget after a refused answer, and what a tightened round proves holds for
    its budget only: an answer that fits the account may lie between. The bound reported is never above the
    fastest answer the account fits (brute force), and "optimal" means that answer. (Before, the tightened round's
    proof was reported: "optimal" 5 % above the optimum here, as hf-gpt2 on 8 ranks at 2x its smallest budget was
    0.4519 ms "optimal" at a budget tightened by 64 KiB where 0.4485 ms fits.)"""
    tightened = 0
    for fraction in (0.7, 0.8, 0.9):
        problem = repeated_blocks(np.random.default_rng(seed), n_blocks=2, block_nodes=2, choices=3,
                                  budget_fraction=fraction)
        ip = IndexedProblem(problem)
        node = ip.names[1]
        budget = problem.budget_bytes
        fits = [t for choice, ckpt, t, peak, _ in every_assignment(ip) if peak + 400 * (choice[1] == 0) <= budget]

        def account(s, problem=problem, node=node) -> int:  # the formulas' peak, and 400 B where `node` takes option 0
            return evaluate(problem, s.choice, s.checkpointed)[1] + 400 * (s.choice[node] == 0)

        sol = solve(problem, account=account)
        if sol.status == "infeasible":  # no round fit the account: the caller searches the least budget (`plan_mesh`)
            continue
        assert sol.status in ("optimal", "feasible") and fits
        best = min(fits)
        assert sol.objective >= best * (1 - 1e-9) and not sol.bound > best * (1 + 1e-9)
        assert sol.status != "optimal" or sol.objective <= best * (1 + 1e-6)
        tightened += "tightened" in sol.message
    assert tightened  # the property is checked where a round was tightened


def test_a_plan_that_counts_less_than_the_solver_gets_the_room_back() -> None:
    """plan_meshes.plan_mesh: where the solver's model counts more than the assembled plan (and so finds
    nothing under the budget), the least-memory plan fits; the solver is then asked again with its budget
    loosened by the difference, for a faster plan that still fits the plan's accounting."""
    from types import SimpleNamespace

    from planner.plans.meshes import plan_mesh

    problem = repeated_blocks(np.random.default_rng(3), n_blocks=4, block_nodes=4, choices=3, budget_fraction=0.7)
    problem.budget_bytes = 0
    least = solve(problem)
    over = least.peak_bytes // 10  # what the solver's model counts beyond the plan's accounting
    budget = least.peak_bytes - over // 2  # below the solver's least memory, above the plan's

    def assemble(built: SimpleNamespace, sol) -> SimpleNamespace:
        return SimpleNamespace(predicted=SimpleNamespace(bound_bytes=sol.peak_bytes - over))

    got = plan_mesh("mesh", lambda _: SimpleNamespace(problem=problem, step_problem=None, apart=None), assemble, budget, solver="highs",
                    time_limit=30.0)
    assert got.plan is not None and got.plan.predicted.bound_bytes <= budget
    problem.budget_bytes = budget + over  # the solver's budget that leaves the plan within `budget`
    assert got.objective == pytest.approx(solve(problem).objective, rel=1e-9)
    assert got.objective < least.objective  # faster than the least-memory plan it used to return


def test_an_ilp_answer_over_the_budget_is_solved_again_tighter(monkeypatch: pytest.MonkeyPatch) -> None:
    """What solver tolerance does to a memory row, made large: the flat ILP's row is loosened by `loose`
    bytes, so its first answer evaluates above the budget. solve() re-evaluates every answer from the
    formulas and tightens its budget until one fits (its one tighten-and-retry loop), never returning an
    answer over the budget, and says so in the message."""
    real = solve_pkg.build_flat
    seen = 0
    for seed in range(40):
        problem = _small(seed, 0.5)
        ref = brute_force(problem)
        if ref.status != "optimal":
            continue
        loose = max(1, problem.budget_bytes // 4)
        monkeypatch.setattr(solve_pkg, "build_flat", lambda ip, mode, budget, loose=loose: real(
            ip, mode, None if budget is None else budget + loose))
        sol = solve(problem, method="flat")
        monkeypatch.setattr(solve_pkg, "build_flat", real)
        first = solve(problem, budget=problem.budget_bytes + loose, method="flat")
        if first.peak_bytes <= problem.budget_bytes:
            continue  # the loosened row changed nothing here
        seen += 1
        assert sol.status in ("optimal", "feasible"), seed
        assert sol.peak_bytes <= problem.budget_bytes, seed
        assert "budget tightened by" in sol.message or "least-memory assignment" in sol.message, seed
        assert sol.objective >= ref.objective * (1 - 1e-9), seed
    assert seen >= 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fastest_bound_is_the_fastest_assignments_time_whatever_its_memory(seed: int) -> None:
    """`fastest_bound`: the least time over every assignment (brute force), whatever the problem's budget fits."""
    from planner.search.solve import fastest_bound

    problem = repeated_blocks(np.random.default_rng(300 + seed), n_blocks=2, block_nodes=3, choices=3,
                              residual=seed % 2 == 0, budget_fraction=0.3)
    least = min(time_s for _, _, time_s, _, _ in every_assignment(IndexedProblem(problem)))
    assert fastest_bound(problem) == pytest.approx(least, rel=1e-6)
    assert fastest_bound(problem) <= least * (1 + 1e-12)  # a bound: never above it (but for float noise)
