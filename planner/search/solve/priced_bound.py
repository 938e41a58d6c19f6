"""Lower bounds for the priced search (`planner.search.solve.columns`): how low the max term can be, and
the multipliers that lift the Lagrangian bound.

The priced bound (see `columns`) for a price (1, b, c) with c·M <= b (M blocks) reads

    time(x) >= value(b, c) + (b - c·M)·floor + c·(recomputed bytes, summed) - b·budget

for every assignment x that fits, where `floor` is any number the max term T of every fitting assignment
is at least. The least op transient is such a number, but at tight budgets it is far too low: the
assignments whose transients are that small need so many additive bytes that they do not fit. A better
floor is the least T that any assignment that fits can have (`max_term_floor`); it is exact (a proof, not
a heuristic), and lifts the bound by b times the difference.

Why it is a floor: let x fit, T(x) its max term, and L the largest transient level <= T(x). Every
transient of x (op working sets and conversion working sets; levels are all their values) is <= T(x), so
<= L, and x is among the assignments allowed by the cap L; so F(L) <= additive(x) <= budget - T(x) <=
budget - L, where F(L) is the least additive bytes any assignment with every transient <= L has. Hence
T(x) >= L >= the least level L with F(L) + L <= budget.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from planner.search.solve.indexed import IndexedProblem

__all__ = ["golden_max", "max_term_floor", "transient_levels"]


def transient_levels(ip: IndexedProblem) -> np.ndarray:
    """Every value a transient can take: op working sets and conversion working sets, sorted, unique."""
    return np.unique(np.concatenate([t.astype(float) for t in ip.transient]
                                    + [e.transient.ravel().astype(float) for e in ip.edges if e.transient is not None]))


def max_term_floor(levels: np.ndarray, least_additive: Callable[[float], float], budget: int,
                   most: int | None = None) -> float | None:
    """The least of `levels` with least_additive(level) + level <= budget (None when none has it), or,
    once `most` calls of least_additive are spent, the least level not yet ruled out (still a floor: every
    level below it is ruled out; a count, so the answer does not depend on the machine's speed).

    least_additive(L) must be F(L) above: exact, and non-increasing in L (a larger cap allows more). So
    for levels l_i <= ... <= l_k, F(l_k) + l_i > budget rules out the whole range at once (each level in it
    is >= l_i and its F is >= F(l_k)); the search halves ranges that are not ruled out, leftmost first,
    so it calls least_additive about log2(len(levels)) times per range it cannot rule out."""
    values = np.unique(np.asarray(levels, dtype=float))
    cache: dict[int, float] = {}
    ranges = [(0, len(values) - 1)] if len(values) else []
    while ranges:
        i, k = ranges.pop()  # every level left of i is ruled out
        if k not in cache:
            if most is not None and len(cache) >= most:
                return float(values[i])
            cache[k] = float(least_additive(float(values[k])))
        if not cache[k] + values[i] <= budget:  # also when nothing fits under the cap (inf)
            continue
        if i == k:
            return float(values[i])
        mid = (i + k) // 2
        ranges += [(mid + 1, k), (i, mid)]
    return None


def golden_max(value: Callable[[float], float], lo: float, hi: float, steps: int,
               stop: Callable[[], bool] = lambda: False) -> None:
    """A golden-section search for the maximum of a unimodal `value` on [lo, hi], `steps` evaluations at
    most (the caller keeps what it learns from each evaluation); `stop()` ends it early."""
    ratio = (np.sqrt(5) - 1) / 2
    a, b = lo, hi
    x1, x2 = b - ratio * (b - a), a + ratio * (b - a)
    f1, f2 = value(x1), value(x2)
    for _ in range(steps - 2):
        if stop():
            return
        if f1 < f2:
            a, x1, f1 = x1, x2, f2
            x2 = a + ratio * (b - a)
            f2 = value(x2)
        else:
            b, x2, f2 = x2, x1, f1
            x1 = b - ratio * (b - a)
            f1 = value(x1)
