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

The same argument bounds the time of every fitting assignment whose level L (the largest transient level
<= its max term) lies in a range [l_i, l_k]: every transient is <= l_k, the max term is >= l_i, so for
any price b >= 0 its time is at least min over y with transients <= l_k of [time(y) + b·additive(y)] +
b·(l_i - budget). The least of these range bounds over ranges that cover every level is a lower bound on
the optimum (`banded_bound`); it is at least the bound with the floor alone (one range), and splitting a
range only raises it. That is what closes the gap where the optimum has a larger max term than the floor
(a larger working set, fewer saved bytes).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import numpy as np

from planner.search.solve.block_dp import Price
from planner.search.solve.indexed import IndexedProblem

__all__ = ["banded_bound", "golden_max", "lagrange_range_bound", "max_term_floor", "price_bound", "range_price",
           "transient_levels"]

_RANGE_STEPS = 5  # prices per golden-section search of one range's bound: over log(mu), then over f ...
_RANGE_SPAN = float(np.log(30.0))  # ... log(mu) within 30 times the enclosing range's best price either way


def price_bound(value: float, price: Price, floor: float, ip: IndexedProblem) -> float:
    """What the least priced sum `value` under `price` (a = 1, c·M <= b, M blocks) proves for every fitting
    assignment whose max term is at least `floor` and whose transients obey the price's cap: its time is at
    least value + (b - c·M)·floor - b·budget (the max term is also at least the mean over all blocks of
    what a checkpointed block recomputes, which the c term prices)."""
    return value + (price.b - price.c * len(ip.block_nodes)) * floor - price.b * ip.budget


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


def banded_bound(levels: np.ndarray, range_bound: Callable[[float, float, Any], tuple[float, Any]],
                 target: float, most: int, stall: int = 3, ranges: list[tuple[float, float, float, Any]] | None = None
                 ) -> float:
    """A lower bound on the optimum: the least range bound over ranges of `levels` that cover them all
    (module docstring). range_bound(cap, floor, hint) -> (bound, hint) must give a valid bound for the
    fitting assignments whose level lies in [floor, cap] (both levels; inf where none fits); `hint` is
    what it returned for the enclosing range (None for the first), e.g. where its best price was. Best
    first: the range with the lowest bound is halved until every range left is at or above `target` (the
    best answer known: then the answer is proven), the lowest is a single level, `most` calls are spent
    (a count, not seconds), or `stall` halvings in a row left the lowest bound where it was (where the
    max term does not bind, no range lifts it). A part's bound is at least its whole's (a subset), so it
    keeps the larger. `ranges`, where given, receives the ranges it ended with, each as (its own range bound,
    floor level, cap level, hint): they cover every level, so a fitting assignment lies in one of them
    (`planner.search.solve.fixing` prices each option in each)."""
    values = np.unique(np.asarray(levels, dtype=float))
    if not len(values):
        return -np.inf
    low, hint = range_bound(values[-1], values[0], None)
    heap: list[tuple[float, int, int, int, Any, float]] = [(low, 0, len(values) - 1, 0, hint, low)]
    calls, flat = 1, 0
    while calls + 2 <= most and flat < stall:
        low, i, k, _, hint, _ = heap[0]
        if low >= target or i == k:
            break
        heapq.heappop(heap)
        mid = (i + k) // 2
        for a, b in ((i, mid), (mid + 1, k)):
            value, part = range_bound(values[b], values[a], hint)
            calls += 1
            heapq.heappush(heap, (max(low, value), a, b, calls, part, value))  # calls: ties never compare hints
        flat = flat + 1 if heap[0][0] <= low + 1e-9 * abs(low) else 0
    if ranges is not None:
        ranges.extend((own, float(values[i]), float(values[k]), hint) for _, i, k, _, hint, own in sorted(heap))
    return float(heap[0][0])


def lagrange_range_bound(minimum: Callable[[Price], float], ip: IndexedProblem, start: Price,
                         stop: Callable[[], bool]) -> Callable[[float, float, Any], tuple[float, Any]]:
    """A `banded_bound` range bound from priced minima: minimum(price) is the least priced sum
    a·time + b·additive + c·recomputed over the assignments whose transients are <= price.cap.

    For a range [floor, cap] every fitting assignment x there has time(x) >= `price_bound` of
    minimum(1, b, c, cap) when c·M <= b (M blocks). With c = f·b/M,
    0 <= f <= 1, the best of two golden-section searches is kept: over log(b) about the enclosing range's
    best price (`start`'s for the first range), then over f at the best b (each bound is concave in its
    multipliers). A range whose least additive bytes under its cap plus its floor exceed the budget holds
    no fitting assignment (inf). `stop()` ends the searches early (the bound stays valid: every price
    gives one)."""
    m = max(len(ip.block_nodes), 1)
    first = (float(np.log(start.b)), min(start.c * m / start.b, 1.0) if ip.checkpointing else 0.0)

    def range_bound(cap: float, floor: float, hint: tuple[float, float] | None) -> tuple[float, tuple[float, float]]:
        log_mu, f = hint or first
        if stop():
            return -np.inf, (log_mu, f)
        if minimum(Price(0.0, 1.0, 0.0, cap=cap)) + floor > ip.budget:
            return np.inf, (log_mu, f)
        seen: dict[tuple[float, float], float] = {}

        def value(x: float, g: float) -> float:
            price = range_price(ip, cap, (x, g))
            seen[x, g] = price_bound(minimum(price), price, floor, ip)
            return seen[x, g]

        golden_max(lambda x: value(x, f), log_mu - _RANGE_SPAN, log_mu + _RANGE_SPAN, _RANGE_STEPS, stop)
        log_mu = max(seen, key=seen.get)[0]
        if ip.checkpointing:
            golden_max(lambda g: value(log_mu, g), 0.0, 1.0, _RANGE_STEPS, stop)
        best = max(seen, key=seen.get)
        return seen[best], best

    return range_bound


def range_price(ip: IndexedProblem, cap: float, hint: tuple[float, float]) -> Price:
    """The price a `lagrange_range_bound` hint (log of the byte price, fraction f of it per recomputed byte
    over M blocks) stands for, under the range's cap."""
    mu = float(np.exp(hint[0]))
    return Price(1.0, mu, hint[1] * mu / max(len(ip.block_nodes), 1), cap=cap)
