"""`PlannerError`: the base of every error a user can cause, in every package of the project.

It lives here because `cost_models` imports nothing of the project, so `layers3d` and `planner` can both
derive from it without an import circle. `planner` re-exports it (`from planner import PlannerError`).

The command line maps exactly these to one line `error: ...` and exit status `exit_code` (2, or 3 when no
plan fits); any other exception is a bug in the planner and is reported as one. Each concrete error class
keeps `ValueError` as a second base, so callers that catch `ValueError` keep working.
"""

from __future__ import annotations

__all__ = ["PlannerError", "PlannerWarning", "internal_error_line", "one_line"]


class PlannerError(Exception):
    """Something the user can fix (a bad budget, model, plan file, profile, launch...): the message says
    what was wrong and how to fix it. `exit_code` is the command line's exit status for it."""

    exit_code: int = 2


class PlannerWarning(UserWarning):
    """Something the plan does not cover that the user may not expect (the command line prints it as one
    line `warning: ...`)."""


def one_line(error: BaseException) -> str:
    """The error's message on one line (its class name when it has none)."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return text or type(error).__name__


def internal_error_line(error: BaseException) -> str:
    """The one line shown for an exception that is not a PlannerError: a bug in the planner, not in what
    the user gave it. The traceback is for `--debug`."""
    return ("internal error, please report it with the command you ran and its output under --debug: "
            f"{type(error).__name__}: {one_line(error)}")
