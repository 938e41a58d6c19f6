"""Run a built ILP and turn its answer into a `Solution` whose figures come from the formulas.

Shared by the flat and the two-level solver: solve for time under the budget; re-evaluate the chosen
assignment exactly (`solve` tightens the budget when solver tolerance let it exceed the budget by a few
bytes); if the budget is infeasible, find the smallest feasible budget.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from planner.search.solve.evaluate import evaluate_indexed
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.milp import WORK_LIMIT, solve_milp
from planner.search.solve.min_budget import Build, LeastMemory, least_memory
from planner.search.solve.problem import Solution

__all__ = ["infeasible_or_fallback", "solve_built"]


def _named(ip: IndexedProblem, choice: list[int]) -> dict[str, int]:
    return {name: int(c) for name, c in zip(ip.names, choice)}


def infeasible_or_fallback(ip: IndexedProblem, least: LeastMemory, base: dict, fits: str = (
        "solver tolerance hid the assignments at the budget's edge; this is the least-memory one")) -> Solution:
    """The answer once no assignment was found under the budget: "infeasible" with the least peak, or, when
    the least-memory assignment does fit, that assignment as "feasible" with the message `fits` (why no
    other answer was found: by default, solver tolerance made the budget look too small)."""
    time_s, peak = (evaluate_indexed(ip, least.choice, least.checkpointed)[:2] if least.choice
                    else (float("nan"), 0))
    fields = dict(choice=_named(ip, least.choice), checkpointed=[ip.block_names[b] for b in least.checkpointed],
                  objective=time_s, peak_bytes=peak, **base)
    if least.peak_bytes is not None and least.peak_bytes <= ip.budget:
        return Solution(status="feasible", gap=float("nan"), message=fits, **fields)
    return Solution(status="infeasible", min_feasible_budget=least.peak_bytes, message=least.message, **fields)


def solve_built(ip: IndexedProblem, build: Build, *, solver: str, deadline: float, method: str,
                initial: tuple[list[int], list[int]] | None = None,
                least_initial: tuple[list[int], list[int]] | None = None, work_limit: int | None = WORK_LIMIT,
                options: Mapping[str, object] | None = None) -> Solution:
    """Minimise step time under `ip.budget` with the models `build(mode, budget)` gives.

    The answer's figures are re-evaluated from the formulas; the solver's feasibility tolerance times a
    byte-sized coefficient can leave its peak a few bytes above the budget, which `solve` sees and answers
    by tightening the budget (its one tighten-and-retry loop).
    `deadline`: a time.perf_counter() value past which the user's time limit stops the solver (inf: none).
    `initial`: an assignment (choice vector, checkpointed blocks) that fits, handed to the solver as a MIP
    start where the model can take one: the work limit (`milp.WORK_LIMIT`) then never leaves it empty-handed;
    `least_initial`: the same for the least-memory solve, when the budget is infeasible. `work_limit`: the
    time-mode ILP's work (`milp.solve_milp`); `options`: its HiGHS options."""
    start = time.perf_counter()
    built = build("time", ip.budget)
    values = built.encode(*initial) if initial is not None and built.encode is not None else None
    res = solve_milp(built.model, solver=solver, time_limit=deadline - time.perf_counter(), work_limit=work_limit,
                     mip_start=values, options=options)
    if res.x is not None:
        choice, ckpt = built.extract(res.x)
        time_s, peak, _ = evaluate_indexed(ip, choice, ckpt)
        return Solution(
            status=res.status, choice=_named(ip, choice), checkpointed=[ip.block_names[b] for b in ckpt],
            objective=time_s, gap=res.gap, seconds=time.perf_counter() - start, solver=res.solver,
            peak_bytes=peak, method=method, message=res.message if res.status != "optimal" else "",
            bound=res.bound / built.scale if np.isfinite(res.bound) else float("nan"),
        )
    if res.status == "infeasible":
        least = least_memory(ip, build, solver=solver, deadline=deadline, initial=least_initial)
        base = dict(seconds=time.perf_counter() - start, solver=res.solver, method=method)
        return infeasible_or_fallback(ip, least, base)
    message = res.message or f"solver status {res.status}"
    if "time" in message.lower():
        message += "; no assignment found within the time limit: raise time_limit"
    return Solution(status="error", seconds=time.perf_counter() - start, solver=res.solver, method=method,
                    message=message)
