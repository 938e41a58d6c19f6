"""`solve`'s step problem: the answer of the backward's memory row is solved first, and where the account
finds that its optimizer step is what does not fit, the rounds go on with the problem that counts the step
(`BuiltProblem.step_problem`); the answer's lower bound comes from the first problem's rounds only, since the
step problem is a restriction of the true one.

Two nodes, each fast with large states or slow with small ones; the optimizer step holds 0.8 x the states
(a foreach-like temporary), alive without the 60 bytes the backward saves. At 280 B the backward's row
takes the fast pair (200 + 60), whose step needs 360; the step problem's row (1.8 x states + saved) takes
the slow pair (216 + 60), whose true need is 120 + max(60, 96) = 216; the one fast node mixes take
160 + 128 = 288 at the step: the slow pair is the true optimum.
"""

from __future__ import annotations

import math

import pytest

from planner.search.solve import solve
from planner.search.solve.problem import Choice, Problem, ProblemNode, Solution

STEP = 0.8


def _problem(step: bool) -> Problem:
    k = 1 + STEP if step else 1

    def node(name: str, saved: int) -> ProblemNode:
        return ProblemNode(name, [Choice(time_s=1.0, recompute_s=0.0, state_bytes=int(100 * k), saved_bytes=saved,
                                         transient_bytes=0),
                                  Choice(time_s=3.0, recompute_s=0.0, state_bytes=int(60 * k), saved_bytes=saved,
                                         transient_bytes=0)])

    return Problem([node("a", 60), node("b", 0)], [], [], 280, checkpointing=False)


def _states(sol: Solution) -> int:
    return sum((100, 60)[c] for c in sol.choice.values())


def _true_bound(sol: Solution) -> int:
    return _states(sol) + max(60, int(STEP * _states(sol)))


@pytest.mark.parametrize("method", ["flat", "auto"])
def test_the_step_problem_takes_over_where_the_step_does_not_fit(method: str) -> None:
    relaxed = solve(_problem(False), budget=280, method=method)
    assert relaxed.choice == {"a": 0, "b": 0} and relaxed.objective == 2.0  # ignores the step: 360 B there

    sol = solve(_problem(False), budget=280, method=method, account=_true_bound,
                step_problem=_problem(True), step_binds=lambda s: STEP * _states(s) > 60)
    assert sol.choice == {"a": 1, "b": 1} and sol.objective == 6.0 and _true_bound(sol) == 216
    # the bound is the backward row's optimum, a lower bound of the true one; the step problem's is not
    assert sol.status == "feasible" and sol.bound == 2.0 and math.isclose(sol.gap, 4 / 6)
    assert "solved with the optimizer step counted" in sol.message

    assert "tightened" not in sol.message  # the step problem's first answer fits: no budget tightened
