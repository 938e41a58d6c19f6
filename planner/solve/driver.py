"""Run a built ILP and turn its answer into a `Solution` whose figures come from the formulas.

Shared by the flat and the two-level solver: solve for time under the budget; re-evaluate the chosen
assignment exactly; if solver tolerances let it exceed the budget by a few bytes, tighten the memory row by
that much and solve again; if the budget is infeasible, find the smallest feasible budget.
"""

from __future__ import annotations

import logging
import time

from planner.solve.evaluate import evaluate_indexed
from planner.solve.indexed import IndexedProblem
from planner.solve.milp import solve_milp
from planner.solve.min_budget import Build, least_memory
from planner.solve.problem import Solution

__all__ = ["solve_built"]

log = logging.getLogger(__name__)

_TOLERANCE_RETRIES = 3


def _named(ip: IndexedProblem, choice: list[int]) -> dict[str, int]:
    return {name: int(c) for name, c in zip(ip.names, choice)}


def solve_built(ip: IndexedProblem, build: Build, *, solver: str, time_limit: float, method: str) -> Solution:
    """Minimise step time under `ip.budget` with the models `build(mode, budget)` gives."""
    start = time.perf_counter()
    deadline = start + time_limit
    cap = ip.budget
    for _ in range(_TOLERANCE_RETRIES + 1):
        built = build("time", cap)
        res = solve_milp(built.model, solver=solver, time_limit=deadline - time.perf_counter())
        if res.x is None:
            break
        choice, ckpt = built.extract(res.x)
        time_s, peak, _ = evaluate_indexed(ip, choice, ckpt)
        if peak <= ip.budget:
            return Solution(
                status=res.status, choice=_named(ip, choice), checkpointed=[ip.block_names[b] for b in ckpt],
                objective=time_s, gap=res.gap, seconds=time.perf_counter() - start, solver=res.solver,
                peak_bytes=peak, method=method, message=res.message if res.status != "optimal" else "",
            )
        log.warning("solver answer exceeds the budget by %d B (tolerance); tightening and solving again",
                    peak - ip.budget)
        cap -= peak - ip.budget
    if res.x is not None:
        return Solution(status="error", seconds=time.perf_counter() - start, solver=res.solver, method=method,
                        message="solver tolerance keeps its answer above the budget; scale the budget up by a "
                                "few bytes or report this problem")
    if res.status == "infeasible":
        least = least_memory(ip, build, solver=solver, deadline=time.perf_counter() + time_limit)
        time_s, peak = (evaluate_indexed(ip, least.choice, least.checkpointed)[:2] if least.choice
                        else (float("nan"), 0))
        return Solution(
            status="infeasible", choice=_named(ip, least.choice),
            checkpointed=[ip.block_names[b] for b in least.checkpointed], objective=time_s, gap=0.0,
            seconds=time.perf_counter() - start, solver=res.solver, peak_bytes=peak,
            min_feasible_budget=least.peak_bytes, method=method, message=least.message,
        )
    message = res.message or f"solver status {res.status}"
    if res.status == "error" and "time" in message.lower():
        message += f"; no assignment found within time_limit={time_limit:g} s: raise time_limit"
    return Solution(status="error", seconds=time.perf_counter() - start, solver=res.solver, method=method,
                    message=message)
