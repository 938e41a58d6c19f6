"""The smallest budget any assignment fits in: minimise peak memory exactly.

Peaks are whole bytes, so a minimum is proven when the solver's lower bound is within half a byte of the
re-evaluated peak of its best assignment. When the bound does not prove it (a time limit, tolerances),
the budget "one byte less" is tried until it is infeasible (at most _STEPS times: a count, not seconds),
unless the work limit stopped the first solve (each try would cost as much: the answer is then an upper
bound, and says so).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from planner.search.solve.evaluate import evaluate_indexed
from planner.search.solve.ilp import BuiltModel
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.milp import WORK_LIMIT, solve_milp

__all__ = ["LeastMemory", "SolveMemo", "least_memory"]

Build = Callable[[str, "int | None"], BuiltModel]
_STEPS = 8  # "one byte less" re-solves at most


@dataclass
class LeastMemory:
    """peak_bytes of the least-memory assignment found; proven says it is the exact minimum."""

    peak_bytes: int | None
    choice: list[int]
    checkpointed: list[int]
    proven: bool
    message: str = ""


class SolveMemo:
    """What solves of one problem find that does not depend on the budget, kept for the next solve of the
    same problem (`solve`'s tighten-and-retry rounds, and `plan_mesh`'s solves of one mesh): the priced
    search's least-memory answer, per solver and per set of shared inputs the solver's view left unfolded.
    Computed once, the same as it would be each time; only answers no time limit or other mesh's plan cut
    short are kept. Also a priced search whose answer the caller refused, with that answer (`solve._priced_search`:
    `plan_mesh`'s first solve and `_once_bound`'s solve of the same problem at the same budget run the same search)."""

    def __init__(self, problem: object) -> None:
        self.problem = problem  # the `Problem` these answers are of
        self.least: dict[tuple[str, tuple[int, ...]], LeastMemory] = {}
        # (solver, budget) -> (PricedSolve, Solution): a search whose answer the caller's account refused, unrefined
        self.priced: dict[tuple[str, int], tuple[object, object]] = {}
        self.last: tuple[tuple[str, int], object, object] | None = None  # the last round's search, if it may be kept

    def keep_last(self) -> None:
        """Keep the last round's priced search for a later solve at its budget (`solve._priced_search`)."""
        if self.last is not None:
            key, search, sol = self.last
            self.priced[key] = (search, sol)
            self.last = None


def least_memory(ip: IndexedProblem, build: Build, *, solver: str, deadline: float,
                 initial: tuple[list[int], list[int]] | None = None) -> LeastMemory:
    """Minimise peak memory over all assignments with the models `build("memory", cap)` gives; `initial`
    (choice vector, checkpointed blocks): an assignment to start from, where the model takes a start."""
    built = build("memory", None)
    start = built.encode(*initial) if initial is not None and built.encode is not None else None
    res = solve_milp(
        built.model, solver=solver, time_limit=deadline - time.perf_counter(), rel_gap=0.0, abs_gap=0.25 / built.unit,
        work_limit=WORK_LIMIT, mip_start=start,
    )
    if res.x is None:
        return LeastMemory(None, [], [], False, f"least-memory solve failed: {res.status} {res.message}".strip())
    choice, ckpt = built.extract(res.x)
    peak = evaluate_indexed(ip, choice, ckpt)[1]
    proven = res.status == "optimal" and res.bound * built.unit >= peak - 0.5
    for _ in range(_STEPS):
        if proven or res.work_limited or time.perf_counter() > deadline:
            break
        built = build("memory", peak - 1)
        res = solve_milp(built.model, solver=solver, time_limit=deadline - time.perf_counter(), rel_gap=0.0,
                         abs_gap=0.25 / built.unit, work_limit=WORK_LIMIT)
        if res.status == "infeasible":
            proven = True
        elif res.x is not None:
            new_choice, new_ckpt = built.extract(res.x)
            new_peak = evaluate_indexed(ip, new_choice, new_ckpt)[1]
            if new_peak >= peak:  # solver tolerance let the same peak through: cannot do better here
                break
            choice, ckpt, peak = new_choice, new_ckpt, new_peak
        else:
            break
    message = "" if proven else f"smallest feasible budget {peak} B is an upper bound (not proven minimal)"
    return LeastMemory(peak, choice, ckpt, proven, message)
