"""Reading and printing quantities people type and read: memory budgets in bytes, and seconds.

Budgets come from command lines and notebooks as "16GiB", "80GB", "1.5 TiB" or plain numbers of bytes.
Binary units (KiB, MiB, GiB, TiB, PiB: powers of 1024) and decimal units (KB, MB, GB, TB, PB: powers of
1000) are both accepted, case-insensitively, with or without a space. A bare "G" is refused because people
mean both 10^9 and 2^30 by it. Numbers are parsed as decimals (not binary floats), so "0.3GB" is exactly
300000000 bytes.
"""

from __future__ import annotations

import math
import numbers
import re
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from cost_models.errors import PlannerError

__all__ = [
    "BudgetError",
    "parse_bytes",
    "format_bytes",
    "format_seconds",
]

_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50,
}
_AMBIGUOUS = {"k": "KiB", "m": "MiB", "g": "GiB", "t": "TiB", "p": "PiB"}
_NUMBER_UNIT = re.compile(r"^\s*([+-]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
# Larger than any memory we will plan for (2^80 B = 1 YiB); guards against "1e999999999" eating RAM.
_MAX_BYTES = 2**80

ACCEPTED_FORMS = (
    "a positive number of bytes with an optional unit, e.g. 16GiB, 80GB, '1.5 TiB', 512MiB or 1e9 "
    "(KiB MiB GiB TiB PiB are powers of 1024, KB MB GB TB PB powers of 1000; case-insensitive)"
)

class BudgetError(PlannerError, ValueError):
    """A memory budget (or other byte count) that cannot be read; the message lists the accepted forms."""


def _budget_error(value: object, why: str) -> BudgetError:
    return BudgetError(f"invalid memory size {value!r}: {why}; expected {ACCEPTED_FORMS}")


def _checked(n: int, value: object) -> int:
    if n < 1:
        raise _budget_error(value, "it must be at least 1 byte")
    if n > _MAX_BYTES:
        raise _budget_error(value, "it is larger than 2^80 bytes")
    return n


def parse_bytes(value: int | float | str) -> int:
    """Number of bytes in `value`: an int, a float, or a string such as "16GiB", "80 GB", "1e9".

    Fractional byte counts are rounded to the nearest byte. Raises `BudgetError` for negative, zero,
    non-finite, empty or unparseable values and unknown units.
    """
    if isinstance(value, bool):
        raise _budget_error(value, "a boolean is not a size")
    if isinstance(value, numbers.Integral):
        n = int(value)
        if n <= 0:
            raise _budget_error(value, "it must be positive")
        return _checked(n, value)
    if isinstance(value, numbers.Real):
        x = float(value)
        if not math.isfinite(x):
            raise _budget_error(value, "it must be a finite number")
        if x <= 0:
            raise _budget_error(value, "it must be positive")
        if x > _MAX_BYTES:
            raise _budget_error(value, "it is larger than 2^80 bytes")
        return _checked(round(x), value)
    if not isinstance(value, str):
        raise _budget_error(value, f"expected an int or a string, got {type(value).__name__}")
    if not value.strip():
        raise _budget_error(value, "it is empty")
    match = _NUMBER_UNIT.match(value)
    if match is None and value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
        raise _budget_error(value, "it must be a finite number")
    if match is None:
        raise _budget_error(value, "it is not a number followed by a unit")
    number, unit = match.group(1), match.group(2).lower()
    if unit in _AMBIGUOUS:
        raise _budget_error(value, f"unit {match.group(2)!r} is ambiguous: write {_AMBIGUOUS[unit]} "
                                   f"(powers of 1024) or {_AMBIGUOUS[unit].replace('i', '')} (powers of 1000)")
    if unit not in _UNITS:
        raise _budget_error(value, f"unknown unit {match.group(2)!r}")
    try:
        amount = Decimal(number.replace("_", ""))
    except InvalidOperation:
        raise _budget_error(value, "it is not a number") from None
    if amount <= 0:
        raise _budget_error(value, "it must be positive")
    if amount.adjusted() > 30:
        raise _budget_error(value, "it is larger than 2^80 bytes")
    total = (amount * _UNITS[unit]).to_integral_value(rounding=ROUND_HALF_EVEN)
    return _checked(int(total), value)


_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: int | float) -> str:
    """A byte count for people, in binary units with one decimal: 17179869184 -> "16.0 GiB", 512 -> "512 B"."""
    if not math.isfinite(n):
        return f"{n} B"
    sign = "-" if n < 0 else ""
    x = abs(float(n))
    if x < 1024:
        return f"{sign}{int(round(x))} B"
    k = 0
    while k + 1 < len(_BINARY_UNITS) and round(x / 1024**k, 1) >= 1024:
        k += 1
    return f"{sign}{x / 1024**k:.1f} {_BINARY_UNITS[k]}"


def format_seconds(s: float) -> str:
    """A duration for people with about three significant digits: "1.23 s", "12.3 ms", "4.56 µs",
    "2 min 3.4 s", "1 h 02 min"."""
    if not math.isfinite(s):
        return f"{s} s"
    sign = "-" if s < 0 else ""
    x = abs(float(s))
    if x == 0:
        return "0 s"
    if x >= 3600:
        minutes = int(round(x / 60))
        return f"{sign}{minutes // 60} h {minutes % 60:02d} min"
    if x >= 60:
        minutes, rest = divmod(round(x, 1), 60)
        return f"{sign}{int(minutes)} min {rest:.1f} s"
    x = float(f"{x:.3g}")  # round first, so 0.99996 s prints as "1 s", not "1e+03 ms"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if x >= scale:
            return f"{sign}{x / scale:.3g} {unit}"
    return f"{sign}{x / 1e-9:.3g} ns"
