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
from dataclasses import replace

from planner.search.solve.brute_force import brute_force
from planner.search.solve.columns import GAP_TOLERANCE, PricedSolve
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
    "AUTO_FLAT_LIMIT", "METHODS", "POLISH_FLAT_LIMIT", "POLISH_GAP", "PROGRESS_DELAY_S", "Block", "Choice", "FrontierTooLarge", "NotDecomposable",
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
# method="auto" hands a priced answer whose gap stays above POLISH_GAP to the flat ILP as a MIP start when
# the flat ILP has at most POLISH_FLAT_LIMIT integer variables: the priced search's Lagrangian bound cannot
# close a duality gap (a tight budget between two far-apart points of the time/memory frontier), the flat
# ILP's branch and bound can, and on a small model it does so in its work limit (hf-llama on a 1-D mesh of
# 8 at 4x its smallest budget, 243 binaries: priced gap 14 %, proven optimal in 0.5 s more). At 955
# binaries (its 2x2x2 mesh) the flat ILP spends 5-11 s to halve the gap without closing it: left out.
POLISH_GAP = 0.01
POLISH_FLAT_LIMIT = 500


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


def _polishable(ip: IndexedProblem, sol: Solution) -> bool:
    return (sol.status == "feasible" and not (sol.gap <= POLISH_GAP) and bool(sol.choice)
            and flat_size(ip) <= POLISH_FLAT_LIMIT)


def _polish(ip: IndexedProblem, sol: Solution, solver: str, deadline: float) -> Solution:
    """The flat ILP started from `sol` (see POLISH_GAP): its answer when faster, and the better of the two
    lower bounds; status "optimal" when the flat ILP proves it. Limits are the flat ILP's (work, not time)."""
    start = (([sol.choice[n] for n in ip.names], [ip.block_names.index(b) for b in sol.checkpointed]))
    flat = solve_built(ip, lambda mode, budget: build_flat(ip, mode, budget), solver=solver, deadline=deadline,
                       method="flat", initial=start)
    if flat.status not in ("optimal", "feasible"):
        return sol
    best = flat if flat.objective < sol.objective else sol
    if flat.status == "optimal":
        bound = flat.objective
    else:
        bound = max((b for b in (sol.bound, flat.bound) if b == b), default=float("nan"))
    gap = max(0.0, (best.objective - bound) / best.objective) if best.objective > 0 and bound == bound else float("nan")
    status = "optimal" if flat.status == "optimal" or gap <= GAP_TOLERANCE else "feasible"
    note = "the flat ILP, started from the priced answer, " + ("proved it optimal" if status == "optimal" else
                                                             f"left a gap of {gap:.2%}")
    return replace(best, status=status, gap=0.0 if status == "optimal" else gap, bound=bound,
                   seconds=sol.seconds + flat.seconds,
                   message=note if status == "optimal" else "; ".join(m for m in (sol.message, note) if m))


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
        elif method == "auto" and _polishable(ip, sol):
            sol = _polish(ip, sol, name, deadline)
    if sol.choice:  # the figures of the problem as given (folding reorders float sums in the last bits)
        vec = [sol.choice[name] for name in exact.names]
        sol.objective, sol.peak_bytes, _ = evaluate_indexed(exact, vec, [exact.block_index(b) for b in sol.checkpointed])
    sol.seconds = time.perf_counter() - start
    return sol
