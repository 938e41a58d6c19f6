"""Solvers: `Problem` -> `Solution` (fastest step under a per-rank memory budget).

    from planner.search.solve import solve, evaluate
    sol = solve(problem)                      # method="auto": two-level for large repeated-block problems
    time_s, peak_bytes, breakdown = evaluate(problem, sol.choice, sol.checkpointed)

`solve` runs the flat ILP (`planner.search.solve.ilp`), the priced search with a column ILP for many identical
blocks (`planner.search.solve.columns`), or the exact two-level solve (`planner.search.solve.two_level`), and always reports the objective and peak recomputed from the formulas (`planner.search.solve.evaluate`).
`brute_force` is the exhaustive reference used by the tests.
"""

from __future__ import annotations

import copy
import logging
import time

from planner.search.solve.brute_force import brute_force
from planner.search.solve.columns import PricedSolve
from planner.search.solve.decompose import Decomposition, NotDecomposable, decompose
from planner.search.solve.driver import solve_built
from planner.search.solve.evaluate import evaluate, evaluate_indexed
from planner.search.solve.flat_start import priced_starts
from planner.search.solve.frontier import FrontierTooLarge
from planner.search.solve.ilp import build_flat, flat_size
from planner.search.solve.indexed import IndexedProblem, ProblemError, fold_fixed_edges
from planner.search.solve.milp import Progress, SolverError, resolve_solver
from planner.search.solve.problem import Block, Choice, Problem, ProblemEdge, ProblemNode, Solution
from planner.search.solve.two_level import TwoLevel

__all__ = [
    "AUTO_FLAT_LIMIT", "METHODS", "PROGRESS_DELAY_S", "Block", "Choice", "FrontierTooLarge", "NotDecomposable",
    "Problem", "ProblemEdge", "ProblemError", "ProblemNode", "Solution", "SolverError", "brute_force", "evaluate",
    "solve",
]

log = logging.getLogger(__name__)

METHODS = ("auto", "flat", "priced", "two_level")
# method="auto" uses the priced solve when the flat ILP would have more integer variables than this and
# the blocks decompose: symmetric copies of a block slow the flat ILP's branch and bound down already at a
# few dozen binaries (e.g. 2 s against 0.2 s for 2 blocks x 6 ops x 4 choices), and a 2-layer GPT on a
# 2x2x2 mesh (574 binaries) takes the flat ILP 30 s against 0.3 s priced (0.6% slower plan).
AUTO_FLAT_LIMIT = 50
# progress=True shows a line only for solves longer than this (seconds)
PROGRESS_DELAY_S = 1.0


def _pick_method(ip: IndexedProblem) -> tuple[str, Decomposition | None]:
    if flat_size(ip) <= AUTO_FLAT_LIMIT:
        return "flat", None
    try:
        dec = decompose(ip)
    except NotDecomposable as err:
        log.info("two-level solve not applicable (%s); using the flat ILP", err)
        return "flat", None
    return "priced", dec


def _flat_starts(ip: IndexedProblem) -> dict[str, tuple[list[int], list[int]] | None]:
    """MIP starts for a flat ILP too large to solve quickly (see `flat_start`), as `solve_built` takes them:
    the fastest assignment that fits and the least-memory one (none for small ILPs)."""
    if flat_size(ip) <= AUTO_FLAT_LIMIT:
        return {}
    found = priced_starts(ip)
    return {key: None if s is None else (s.choice, s.ckpt)
            for key, s in (("initial", found.fastest), ("least_initial", found.least))}


def solve(problem: Problem, *, budget: int | None = None, solver: str = "highs", time_limit: float | None = None,
          method: str = "auto", progress: bool = False) -> Solution:
    """The fastest assignment (one choice per node, checkpointed blocks) whose peak fits the budget.

    budget: per-rank bytes the answer must fit (default: `problem.budget_bytes`); the problem is not
        changed, so one built problem serves every budget.
    solver: "highs" (falls back to "cbc" with a warning when highspy is missing) or "cbc".
    time_limit: None (default): every limit is counted in work (branch-and-bound nodes, solver
        checkpoints, prices, rounds), so the answer is a function of the problem alone and the same on
        a busy machine as on a quiet one.
        Seconds: the solve also stops there, returning the best assignment found so far with status
        "feasible", its gap and a message saying so (or status "error" if none was found); the answer then
        depends on the machine's speed.
    method: "flat" (exact), "priced" (fast, for many identical blocks: a priced search and a column ILP,
        status "optimal" only when its gap to a Lagrangian lower bound closes, otherwise "feasible" with
        that gap), "two_level" (exact; both raise NotDecomposable when the blocks do not have one input
        and one output node each) or "auto" (flat for small problems, priced for decomposable ones).
    progress: show a spinner on stderr for solves that last more than a second.

    An infeasible budget gives status "infeasible" with `min_feasible_budget` (the least peak; `message`
    says when the time limit left it unproven) and the least-memory assignment in `choice`,
    `checkpointed` and `peak_bytes`.
    """
    if method not in METHODS:
        raise SolverError(f"unknown method {method!r}; use one of {METHODS}")
    if time_limit is not None and not time_limit > 0:
        raise SolverError(f"time_limit must be > 0 seconds, got {time_limit}")
    name = resolve_solver(solver)
    start = time.perf_counter()
    deadline = float("inf") if time_limit is None else start + time_limit
    exact = IndexedProblem(problem, budget)
    ip = copy.copy(exact)  # the solvers' view: folding replaces list entries, so the lists are copied
    ip.time, ip.recompute, ip.transient, ip.edges = (list(exact.time), list(exact.recompute),
                                                      list(exact.transient), list(exact.edges))
    fold_fixed_edges(ip)
    chosen, dec = _pick_method(ip) if method == "auto" else (method, None)
    with Progress(progress, f"planner: {chosen.replace('_', '-')} solve of {ip.n} nodes", PROGRESS_DELAY_S):
        sol = None
        if chosen == "priced":
            try:
                sol = PricedSolve(ip, dec or decompose(ip)).solve(name, deadline)
            except NotDecomposable as err:
                if method == "priced":
                    raise
                log.info("priced solve not applicable (%s); using the flat ILP", err)
        if chosen == "two_level":
            try:
                sol = TwoLevel(ip, dec).solve(name, deadline)
            except (NotDecomposable, FrontierTooLarge) as err:
                if method == "two_level":
                    raise
                log.info("two-level solve not applicable (%s); using the flat ILP", err)
        if sol is None:
            sol = solve_built(ip, lambda mode, budget: build_flat(ip, mode, budget), solver=name,
                              deadline=deadline, method="flat", **_flat_starts(ip))
    if sol.choice:  # the figures of the problem as given (folding reorders float sums in the last bits)
        vec = [sol.choice[name] for name in exact.names]
        sol.objective, sol.peak_bytes, _ = evaluate_indexed(exact, vec, [exact.block_index(b) for b in sol.checkpointed])
    sol.seconds = time.perf_counter() - start
    return sol
