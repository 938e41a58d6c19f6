"""The schemes a user may restrict planning to (`plan(schemes=...)`, CLI `--schemes`): user names to strategy
schemes, and the restriction of one op's strategies to them."""

from __future__ import annotations

from cost_models import schemes as schemes_mod
from cost_models.errors import PlannerError
from cost_models.ops import OpNode
from cost_models.strategy import HEAVY_SCHEMES, Strategy

__all__ = ["SchemeError", "SchemeUnavailable", "expand_schemes", "restrict_schemes"]


class SchemeError(PlannerError, ValueError):
    """An unknown scheme name in `schemes=`."""


class SchemeUnavailable(SchemeError):
    """The requested schemes cannot run the model's linear ops on this mesh shape (the planner skips it)."""


def expand_schemes(schemes: list[str] | tuple[str, ...] | str | None) -> frozenset[str] | None:
    """User scheme names -> strategy scheme names ("1d" covers 1d_col and 1d_row)."""
    if schemes is None:
        return None
    if isinstance(schemes, str):
        schemes = [s for s in schemes.split(",") if s.strip()]
    out: set[str] = set()
    for s in schemes:
        s = s.strip()
        if s in schemes_mod.BASELINE_SCHEMES:
            out |= set(schemes_mod.UNIFORM_GROUPS[schemes_mod.BASELINE_SCHEMES.index(s)])
        elif s in HEAVY_SCHEMES:
            out.add(s)
        else:
            raise SchemeError(f"unknown scheme {s!r}; use any of: " + ", ".join(schemes_mod.USER_SCHEMES))
    if not out:
        raise SchemeError("schemes= is empty; leave it out to allow every scheme")
    return frozenset(out)


def restrict_schemes(op: OpNode, strategies: list[Strategy], reasons: list[str], allowed: frozenset[str] | None):
    """Keep only allowed heavy schemes, when the op offers any of them."""
    if allowed is None:
        return strategies, reasons
    keep = [s for s in strategies if s.scheme in allowed]
    if not keep:
        if op.kind == "linear":
            raise SchemeUnavailable(f"{op.name}: none of {sorted(allowed)} is offered on this mesh")
        return strategies, reasons
    dropped = sorted({s.scheme for s in strategies if s.scheme not in allowed})
    if dropped:
        reasons = reasons + [f"{', '.join(dropped)}: excluded by schemes={sorted(allowed)}"]
    return keep, reasons
