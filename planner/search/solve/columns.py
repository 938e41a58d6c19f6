"""Fast solve for many identical blocks: price memory, sweep exactly, then mix the blocks with an ILP.

Relaxing the budget row with a price mu per byte (Lagrange) leaves an unconstrained sum that exact
dynamic programming minimises in milliseconds (`planner.search.solve.price_sweep`). Each price gives

* an assignment (re-evaluated exactly: feasible when its peak fits), and
* a lower bound: for every assignment x that fits, time(x) >= min_y [time(y) + mu·additive(y)] +
  mu·(floor - budget), with floor the least max term an assignment that fits can have
  (`planner.search.solve.priced_bound`). Where the answer is still more than 5 % above it, the same
  bound over ranges of max-term levels (each range with its own cap and floor, the lowest range halved
  first) lifts it further (`priced_bound.banded_bound`).

A search over mu finds the cheapest price whose assignment fits. The blocks priced along the way are the
columns of the two-level outer ILP (`planner.search.solve.two_level`, with counts of identical blocks per
column), which mixes them exactly under the budget, max term included: a few layers checkpointed, a few
on another scheme. The answer is never worse than the best priced assignment that fits, and its gap to
the best lower bound is reported (status "optimal" only when the gap closes).

Prices do not see the max term, so searches also run under transient caps, and where no price fits, with
the bytes a checkpointed block recomputes priced like additive bytes (its recompute peak, activations plus
its largest working set, is then the max term to shrink). Before each column ILP the columns that cannot
be in an answer that fits, or that beats the best answer so far, are dropped (`two_level.usable_columns`): at tight budgets
that is most of them (gpt-tiny on 2x2x2 at 420 KiB: 11,184 -> 1,299), and the ILP that timed out without
an answer solves in a few seconds. And so that the mix is never worse than one scheme throughout (what a user would otherwise pick), a short search per uniform scheme
ranks them; the closest gets the full search and a column ILP of its own blocks, whose answer prunes the
ILP of all blocks (at a budget that no price fits, every scheme gets the full search and its own ILP).

Evaluating prices, recording their minimisers and building the columns from them is `PricedRuns`
(`planner.search.solve.priced_runs`); this module decides which prices to evaluate and mixes the columns.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from planner.search.solve import piece_swaps
from planner.search.solve.block_dp import BlockTable, Price
from planner.search.solve.decompose import Decomposition
from planner.search.solve.driver import infeasible_or_fallback
from planner.search.solve.evaluate import evaluate_indexed
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.milp import resolve_solver
from planner.search.solve.min_budget import LeastMemory, SolveMemo
from planner.search.solve.priced_bound import (
    banded_bound,
    golden_max,
    lagrange_range_bound,
    max_term_floor,
    range_price,
    transient_levels,
)
from planner.search.solve.priced_runs import Priced, PricedRuns
from planner.search.solve.problem import GAP_TOLERANCE, NOT_PROVEN, Solution, relative_gap
from planner.search.solve.two_level import TwoLevel, usable_columns

__all__ = ["PricedSolve", "GAP_TOLERANCE"]

log = logging.getLogger(__name__)

_SEARCH_STEPS = 10  # most bisection steps on log(mu) ...
_SEARCH_RATIO = 1.2  # ... stopping once the feasible and infeasible prices are this close
_UNIFORM_STEPS = 4  # prices per uniform-scheme search
_CAPS_TIGHT = 6  # ... and when no price alone gives a plan that fits
_BOUND_STEPS = 12  # prices of the golden-section search that lifts the lower bound (over 4 decades of mu)
_LIFT_GAP = 0.05  # past this gap after the first bound search, the floor is raised, two more searches run
# and then the search by ranges of max-term levels (`_banded`)
_FLOOR_PRICES = 32  # least-additive prices (under transient caps) that the max-term floor search may spend
_BAND_RANGES = 12  # ranges of max-term levels whose bounds the final bound search may price
# A column ILP stops within _ILP_GAP of its own optimum, or where the answer so far is further than that from
# the priced lower bound, within _ILP_GAP_SHARE of that distance (at most _ILP_GAP_MAX): the ILP's own bound
# holds for its columns only, so proving its optimum closer never lowers the gap the answer reports, and it was
# most of the work (gpt3-175b, 8 ranks, 2x2x2 at 2x its smallest budget, gap 0.44 %: 8,856 nodes and 15 s,
# the last incumbent found at node 3,342 after 7 s).
_ILP_GAP = 1e-4
_ILP_GAP_SHARE = 0.1
_ILP_GAP_MAX = 1e-3
# Branch-and-bound nodes per column ILP: of one uniform scheme's columns, and of all columns. Work, not
# seconds, so that the plan does not depend on how busy the machine is.
_ILP_NODES_UNIFORM = 2_000
_ILP_NODES_MIXED = 10_000
# ... and both stop once this many nodes pass without a better answer: on GPT-3 175B's 8-rank plans at 1.5x
# and 2x its smallest budget (96 layers, (8,) mesh) the mixed ILP found its answer by node ~900 and then
# ran out its 10,000 nodes at a 0.2 % gap that does not close (18-43 s, most of the plan's time)
_ILP_STALL = 1_000
# Where nothing found fits, when the least-memory search runs (`PricedSolve.solve`'s `least`)
LEAST_MODES = ("always", "unproven", "never")
# With least "never" (`narrow_least`, looking below the least-memory plan's bound for a smaller budget), each column
# ILP stops after this much work (`solve_milp`): its answer only narrows the smallest budget, where any answer that
# fits does, and proving that none exists can take HiGHS's root long (zoo HF BERT on 2x2x2: 17 s of cut rounds at
# one node for "infeasible"; 1 s to this limit)
_NARROW_WORK = 1_000_000


def _ilp_gap(upper: float, bound: float) -> float:
    """The relative gap at which a column ILP may stop, given the answer so far (`upper`, inf: none) and the
    priced lower bound (see _ILP_GAP)."""
    if not (np.isfinite(upper) and np.isfinite(bound) and upper > 0):
        return _ILP_GAP
    return float(np.clip(_ILP_GAP_SHARE * (upper - bound) / upper, _ILP_GAP, _ILP_GAP_MAX))


class PricedSolve(PricedRuns):
    """The priced search and the column ILP for one decomposable problem (see the module docstring)."""

    def __init__(self, ip: IndexedProblem, dec: Decomposition,
                 beaten: Callable[[float], bool] | None = None, memo: SolveMemo | None = None) -> None:
        """beaten(bound): whether an answer found elsewhere (another mesh's plan) is faster than `bound`
        seconds; once the best lower bound here is beaten the search stops (status "beaten"). memo: the
        least-memory answer of an earlier solve of `ip.problem`, and where this one's goes."""
        super().__init__(ip, dec)
        self.memo = memo if memo is not None and memo.problem is ip.problem else SolveMemo(ip.problem)
        self.beaten = beaten
        self.least = "always"  # when nothing fits: the least-memory search (see `solve`'s `least`)
        self.dominated = False  # the best lower bound here is beaten (see __init__)
        self.stats: dict[str, float] = {}
        self.scale = max(ip.time_magnitude(), 1e-30) / max(ip.budget, 1)  # seconds per budget byte, at most
        self.tiny = self.scale * 1e-9  # a price per byte that only breaks ties between equally fast choices
        self.least_runs: list[int] = []  # indices into `priced` (and `tables`) of `_least_columns`'s prices
        self._floors: dict[float, float | None] = {}  # `_floor_search` per floor it started from
        self.stopped = False  # the user's time limit cut the search or an ILP short
        # `_banded`'s last ranges of max-term levels: (own bound, floor level, price); fixing prices options in each
        self.ranges: list[tuple[float, float, Price]] | None = None

    def _late(self, deadline: float) -> bool:
        """Whether to stop searching: the user's time limit (a time.perf_counter() value; inf: none) has
        passed, or the best lower bound is beaten by an answer found elsewhere."""
        if time.perf_counter() > deadline:
            self.stopped = True
        if self.beaten is not None and not self.dominated and self.beaten(self.best_bound):
            self.dominated = True
        return self.stopped or self.dominated

    def _floor_search(self) -> float | None:
        """The least max term that an assignment that fits can have, from `floor` up
        (`priced_bound.max_term_floor`: exact minima of the additive bytes under transient caps); None when
        that proves that no assignment fits the budget (at a budget below every assignment's peak, after one
        sweep). Exact at the least budget on HF BERT (2x2x2 and 4x4x4: one byte below the least peak proven
        infeasible in 0.05 s, where the priced search took 10 s to find nothing). Searched once per floor."""
        if self.floor not in self._floors:
            levels = transient_levels(self.ip)

            def least_additive(cap: float) -> float:
                return self.sweep.minimum(Price(0.0, 1.0, 0.0, cap=cap))

            self._floors[self.floor] = max_term_floor(levels[levels >= self.floor], least_additive, self.ip.budget,
                                                      _FLOOR_PRICES)
        return self._floors[self.floor]

    def _raise_floor(self) -> bool:
        """Raise `floor` from the least op transient to the least max term that an assignment that fits can
        have (`_floor_search`), and recompute every priced assignment's bound with it. False when that search
        proves that no assignment fits the budget."""
        found = self._floor_search()
        if found is not None and found > self.floor:
            self.floor = found
            for r in self.priced:
                r.bound = self._bound(r.price, r.value)
                self.best_bound = max(self.best_bound, r.bound)
        return found is not None

    def _banded(self, target: float, deadline: float) -> float:
        """A lower bound by ranges of max-term levels (`priced_bound.banded_bound`), searched until it
        reaches `target` (the best time known) or _BAND_RANGES ranges are priced, starting from the price
        that proved the best bound so far. Its minimisers stay out of the columns: with them and one more
        ILP of all blocks, answers were 1-5 % faster on a quarter of the tiny HF cases at tight budgets, for
        about twice the plan time."""
        levels = transient_levels(self.ip)
        bound = lagrange_range_bound(self.sweep.minimum, self.ip, self.bound_price(),
                                     lambda: self._late(deadline))
        ranges: list[tuple[float, float, float, Any]] = []
        out = banded_bound(levels[levels >= self.floor], bound, target * (1 - GAP_TOLERANCE), _BAND_RANGES,
                           ranges=ranges)
        self.ranges = [(own, floor, range_price(self.ip, cap, hint)) for own, floor, cap, hint in ranges]
        return out

    def bound_price(self) -> Price:
        """The price that proved the best bound so far (`best_proved`), or one byte priced at the time a
        budget byte is worth where none did: where the bound searches and reduced-cost fixing start."""
        best = self.best_proved()
        return self.priced[best].price if best is not None else Price(1.0, self.scale)

    # --- the search -------------------------------------------------------------------------------
    def solve(self, solver: str, deadline: float, lift: bool = True, least: str = "always") -> Solution:
        """The answer (see the module docstring); `deadline`: a time.perf_counter() value where the user's
        time limit stops the search (inf: none; every other limit is a count). Without `lift`, the bound by
        ranges of max-term levels is left to a later `lift(answer)`: a caller that may discard this answer
        (`solve`'s tighten-and-retry loop) prices it only for the answer it keeps. `least`: where nothing found
        fits, the least-memory search runs "always", "unproven" (not where the search proved that nothing
        fits: `solve` with an account, whose caller searches for the least budget itself) or "never" (the
        caller knows the least-memory answer does not fit: `narrow_least`); without it the answer is
        "infeasible" alone."""
        if least not in LEAST_MODES:
            raise ValueError(f"least must be one of {LEAST_MODES}, not {least!r}")
        self.least = least
        start = time.perf_counter()
        ip = self.ip
        fastest = self.evaluate(Price(1.0, self.tiny))
        if fastest.peak <= ip.budget and fastest.time_s - fastest.bound <= GAP_TOLERANCE * fastest.time_s:
            return self._answer(fastest, start, "optimal", 0.0, "", fastest.bound)
        if fastest.peak > ip.budget and self._floor_search() is None:
            # proven: nothing fits (planning at 1 byte to learn the smallest budget; `plan_mesh`'s budget-0
            # solve): no price is searched for time, only the least-memory answer
            return self._nothing_fits(start, solver, deadline, proven=True)
        if self._late(deadline) and self.dominated:
            return self._beaten(start)
        mu0 = fastest.time_s / max(ip.budget, 1) * 1e-2  # a byte at 1/100 of the time per budget byte
        top = self.scale * 1e8
        hi = self._explore((), mu0, top, deadline)
        groups = self._groups()
        if hi is None:  # a tight budget: each uniform scheme gets the full search (mostly skipped, see _explore)
            for group in groups:
                if self._late(deadline):
                    break
                self._explore(group, mu0, top, deadline)
            firsts, mixed = groups, None  # which schemes' blocks mix into a plan that fits is not known
        else:
            for group in groups:  # short searches, one per uniform scheme, rank them ...
                if self._late(deadline):
                    break
                self._uniform(group, hi)
            closest = self._closest(groups)
            if closest is not None and not self._late(deadline):
                self._explore(closest, mu0, top, deadline)  # ... and the closest one gets the full search
            firsts = [closest] if closest is not None else []
            mixed = [(), *firsts]  # the other short searches only ranked the schemes: their columns stay out
        if any(r.peak <= ip.budget for r in self.priced):  # a bound only matters beside an answer
            start_mu = self.priced[self.best_proved()].price.b
            self._lift_bound(start_mu / 100, start_mu * 100, deadline, (1.0,))
            best = min(r.time_s for r in self.priced if r.peak <= ip.budget)
            if best - max(r.bound for r in self.priced) > _LIFT_GAP * best and self._raise_floor():
                start_mu = self.priced[self.best_proved()].price.b
                self._lift_bound(start_mu / 100, start_mu * 100, deadline, (0.0, 0.5))
        sol = self._finish(start, deadline, solver, firsts, mixed)
        if lift:
            self.lift(sol, deadline)
        return sol

    def _least_columns(self, deadline: float) -> None:
        """Price the least-memory blocks of all choices and of each uniform scheme: the least additive bytes
        with a checkpointed block's recomputed bytes priced in full, at 1/M (the mean over M blocks, as one
        block's recompute peak is what counts) and not at all, each also under the transient caps below
        its minimiser's largest transient; each with no time priced and with a price per second that only
        breaks ties between equally small choices, both independent of the budget, so the columns are the
        same at every budget. Which equally small blocks the sweeps keep changes the least peak the column
        ILP mixes, either way: without the tie price, gpt-tiny on 64 ranks 99,968 -> 143,168 B; with it
        alone, HF BERT on 64 ranks 1,137,728 -> 1,139,104 B."""
        m = max(len(self.ip.block_nodes), 1)
        tie = 1e-6 / max(self.ip.time_magnitude(), 1e-30)  # a microbyte's worth of time: not the budget's
        for only in [(), *self._groups()]:
            if self._late(deadline):
                return
            # swept together: the six prices, then the caps below each one's minimiser
            leasts = self._sweep_many([Price(a, 1.0, c, only=only)
                                       for a, c in itertools.product((0.0, tie), (1.0, 1.0 / m, 0.0))])
            caps = [[replace(r.price, cap=cap) for cap in self._caps(r.choice, _CAPS_TIGHT, only)] for r, _ in leasts]
            capped = iter(self._sweep_many([p for ps in caps for p in ps]))
            for least, ps in zip(leasts, caps):
                for r, tables in [least, *itertools.islice(capped, len(ps))]:
                    self._record(r, tables)
                    self.least_runs.append(len(self.priced) - 1)

    def lift(self, sol: Solution, deadline: float) -> None:
        """Where `sol` (this search's answer) is still more than _LIFT_GAP above its bound, raise the bound
        by ranges of max-term levels (`_banded`) and update its gap and status."""
        if sol.status in ("optimal", "feasible") and sol.objective - sol.bound > _LIFT_GAP * sol.objective:
            sol.raise_bound(self._banded(sol.objective, deadline), GAP_TOLERANCE)

    def improve(self, sol: Solution, solver: str, deadline: float) -> Solution:
        """`sol` (this search's answer), or a faster one that fits from the blocks one piece away from its own,
        then also from the minimisers of pinned prices (`pinned.pin_columns`: one node kept to one group of
        its options; `piece_swaps.improve`); its bound is `sol`'s."""
        found = piece_swaps.improve(self, sol, solver, deadline, lambda upper: _ilp_gap(upper, sol.bound),
                                    lambda: self._late(deadline), pins=True)
        if found is None:
            return sol
        choice, ckpt, value, cut = found
        out = self._solution(choice, ckpt, value, time.perf_counter(), relative_gap(value, sol.bound), solver, cut,
                             sol.bound)
        out.seconds = sol.seconds
        return out

    def _beaten(self, start: float) -> Solution:
        return Solution.beaten_by_elsewhere(self.best_bound, time.perf_counter() - start, solver="dp",
                                            method="priced")

    def _lift_bound(self, lo: float, hi: float, deadline: float, weights: tuple[float, ...]) -> None:
        """Raise the lower bound: golden-section searches over log(mu) of the bound of prices (1, mu, f·mu/M),
        one per f of `weights`: f = 1 prices every checkpointed block's recomputed bytes at 1/M (the mean-over-
        blocks term of `_bound`, strong where recompute peaks fill the memory), f = 0 counts the max term at
        `floor` alone (strong once `_raise_floor` lifted it). Each bound is concave in mu, so unimodal in
        log(mu). _BOUND_STEPS prices per search; their minimisers also join the columns."""
        m = len(self.ip.block_nodes)
        if not m or not self.ip.checkpointing:
            return
        def bound(log_mu: float, f: float) -> float:
            mu = float(np.exp(log_mu))
            return self.evaluate(Price(1.0, mu, f * mu / m)).bound

        for f in weights:
            golden_max(lambda x, f=f: bound(x, f), float(np.log(lo)), float(np.log(hi)), _BOUND_STEPS,
                       lambda: self._late(deadline))

    def _explore(self, only: tuple[str, ...], mu0: float, top: float, deadline: float) -> float | None:
        """The search over prices, restricted to the choices labelled `only` (all when empty): the cheapest
        price whose minimiser fits, then searches under transient caps below the answer's largest transient
        (a smaller max term leaves room for more additive bytes). When no price alone fits, the max term
        (transients, recompute peaks), which prices do not see, must shrink: the caps start from the
        least-memory assignment (each skipped when that assignment under its cap does not fit). A restricted
        search starts from its own fastest assignment's time per budget byte, as a solve of the restricted
        problem would. Returns the cheapest fitting price of the first search, or None."""
        ip = self.ip
        if only:  # start where a solve restricted to these choices would: from their own fastest assignment
            mu0 = self.evaluate(Price(1.0, self.tiny, only=only)).time_s / max(ip.budget, 1) * 1e-2
        hi = self._search(mu0, top, Price(1.0, 0.0, only=only), _SEARCH_STEPS, deadline)
        if hi is None:  # the recompute peaks may be what does not fit: price their bytes too
            hi = self._search(mu0, top, Price(1.0, 0.0, only=only), _SEARCH_STEPS, deadline, tie=True)
        if hi is None:
            least = self.evaluate(Price(0.0, 1.0, 1.0, only=only))
            caps = self._caps(least.choice, _CAPS_TIGHT, only)
            # the least-memory assignment under each cap, swept together (`_least_first` records each)
            firsts = self._sweep_many([Price(0.0, 1.0, 1.0, cap=cap, only=only) for cap in caps])
            for cap, first in zip(caps, firsts):
                if self._late(deadline):
                    break
                self._least_first(Price(1.0, 0.0, cap=cap, only=only), first, mu0, top, deadline)
            return None
        self.evaluate(Price(1.0, hi, hi, only=only))  # blocks that also keep their recompute peak low
        best = min((r for r in self.priced if r.peak <= ip.budget and r.price.only == only),
                   key=lambda r: r.time_s)
        self.evaluate_many([Price(1.0, mu, 0.0, cap, only) for cap in self._caps(best.choice, 0, only)
                            for mu in (hi, hi / 4)])
        return hi

    def _least_first(self, base: Price, first: tuple[Priced, list[BlockTable]], mu0: float, top: float,
                     deadline: float) -> None:
        """A short search of `base`'s prices, skipped when even its least-memory assignment (`first`, not yet
        recorded: the minimiser under `base` with a = 0, b = c = 1) does not fit (a heuristic: large prices
        tend to the least additive bytes, so the search would most likely find nothing that fits either)."""
        self._record(*first)
        if first[0].peak <= self.ip.budget:
            self._search(mu0, top, base, 3, deadline)
            self._search(mu0, top, base, 3, deadline, tie=True)

    def _closest(self, groups: list[tuple[str, ...]]) -> tuple[str, ...] | None:
        """The uniform group whose assignments came closest: the fastest that fits, else the least peak."""
        ip = self.ip
        runs = [r for r in self.priced if r.price.only in groups]
        fits = [r for r in runs if r.peak <= ip.budget]
        if fits:
            return min(fits, key=lambda r: r.time_s).price.only
        return min(runs, key=lambda r: r.peak).price.only if runs else None

    def _search(self, mu: float, top: float, base: Price, steps: int, deadline: float,
                tie: bool = False) -> float | None:
        """The cheapest price (of `base` with b = mu, and c = mu too with `tie`) whose minimiser fits: grow
        mu tenfold until one fits, then bisect on log(mu) for at most `steps` steps. None when none fits
        below `top`.

        The minimiser's additive bytes only fall as mu grows, and once they reach those of the minimiser
        at `top` (the least additive bytes, fastest among those), larger prices give that same assignment:
        when it does not fit, the growth stops there."""
        ip = self.ip
        limit = self.evaluate(replace(base, b=top, c=top if tie else base.c))
        lo, hi = 0.0, (top if limit.peak <= ip.budget else None)
        while mu < top and not self._late(deadline):
            r = self.evaluate(replace(base, b=mu, c=mu if tie else base.c))
            if r.peak <= ip.budget:
                hi = mu
                break
            if hi is None and r.choice == limit.choice and r.ckpt == limit.ckpt:
                return None
            lo, mu = mu, mu * 10
        if hi is None:
            return None
        for _ in range(steps):
            if self._late(deadline) or (lo > 0 and hi / lo < _SEARCH_RATIO):
                break
            mid = np.sqrt(lo * hi) if lo > 0 else hi / 10
            if self.evaluate(replace(base, b=mid, c=mid if tie else base.c)).peak <= ip.budget:
                hi = mid
            else:
                lo = mid
        return hi

    def _groups(self) -> list[tuple[str, ...]]:
        """The problem's uniform label groups that some node offers."""
        present = {x for labels in self.ip.labels if labels is not None for x in labels}
        return [g for g in self.ip.problem.uniform_groups if present & set(g)]

    def _uniform(self, group: tuple[str, ...], mu: float) -> None:
        """A short price search with every labelled node on `group`: its blocks join the columns, so the
        mix is never worse than what one scheme throughout would give (up to this search's own gap)."""
        ip = self.ip
        lo, hi = None, None
        for _ in range(_UNIFORM_STEPS):
            r = self.evaluate(Price(1.0, mu, only=group))
            if r.peak <= ip.budget:
                hi = mu
                if lo is not None and hi / lo < 2.5:
                    break
                mu = mu / 3 if lo is None else np.sqrt(lo * hi)
            else:
                lo = mu
                mu = mu * 3 if hi is None else np.sqrt(lo * hi)
        if hi is None:
            self.evaluate(Price(0.0, 1.0, 1.0, only=group))

    def _finish(self, start: float, deadline: float, solver: str, firsts: list[tuple[str, ...]],
                mixed: list[tuple[str, ...]] | None) -> Solution:
        ip = self.ip
        fits = [r for r in self.priced if r.peak <= ip.budget]
        best = min(fits, key=lambda r: r.time_s, default=None)
        bound = max((r.bound for r in self.priced), default=-np.inf)
        answer = (best.choice, best.ckpt, best.time_s) if best is not None else None
        # First the column ILPs of single uniform schemes' blocks (small and quick: each answer is what
        # planning with that scheme alone would find, and prunes the next ILP), then the ILP of all blocks.
        # Each stops at its node limit or once it stalls (past them the improvements are small, and some
        # column sets make HiGHS slow to prove optimality); the answer then says so.
        rounds = [([group], _ILP_NODES_UNIFORM) for group in firsts] + [(mixed, _ILP_NODES_MIXED)]
        proven = best is None and not self._raise_floor()
        if proven:
            # proven: nothing fits, so no column ILP can find an answer (and proving that is what takes a
            # node-limited ILP long); only the least-memory ILP over the last round's columns is left
            outer = self._outer(mixed)
            every, rounds = outer.points, []
        cut = False
        for only, nodes in rounds:
            if self._late(deadline) and self.dominated:
                return self._beaten(start)
            upper = answer[2] if answer is not None else np.inf
            outer = self._outer(only)
            every = outer.points
            outer.points = usable_columns(ip, self.dec, every, outer.allowed, upper)
            work = _NARROW_WORK if self.least == "never" else None
            rnd = outer.outer("time", solver, deadline, upper, rel_gap=_ilp_gap(upper, bound), node_limit=nodes,
                              stall_nodes=_ILP_STALL, work_limit=work)
            cut = cut or rnd.res.status not in ("optimal", "infeasible")
            fits = rnd.peak <= ip.budget or answer is None  # over by solver tolerance: only in place of none
            if rnd.res.x is not None and rnd.value < upper and fits:
                answer = (rnd.choice, rnd.ckpt, rnd.value)
        self.stats["columns"] = float(sum(len(p) for p in outer.points))
        if answer is not None:
            return self._solution(*answer, start, relative_gap(answer[2], bound), solver, cut, bound)
        # Nothing fits among these columns: the least-memory ILP over the least-memory columns (the answer
        # and the least peak a budget-0 solve gives; at that budget, this answer is the one that fits). Over
        # all columns it took 8 s on HF GPT-2's 4x4x4 mesh (27,111 columns) for the same least peak.
        if self._late(deadline):
            outer.points = every  # the least memory may use columns that do not fit: all of the last round's
            return self._nothing_fits(start, solver, deadline, outer, proven)
        return self._nothing_fits(start, solver, deadline, proven=proven)

    def _nothing_fits(self, start: float, solver: str, deadline: float, outer: TwoLevel | None = None,
                      proven: bool = False) -> Solution:
        """The answer when no assignment found fits: the least-memory one (`_least_memory`), or where the
        caller's `least` leaves it out (`proven`: the search proved that nothing fits), "infeasible" alone.
        (Unproven, the least-memory answer may fit, and is the answer then.)"""
        if self.least == "always" or (self.least == "unproven" and not proven):
            return self._least_memory(start, solver, deadline, outer)
        return Solution(status="infeasible", seconds=time.perf_counter() - start, solver=resolve_solver(solver),
                        method="priced", message=("proven: no assignment fits the budget" if proven else
                                                  "no assignment found fits the budget") + " (least memory not searched)")

    def _least_memory(self, start: float, solver: str, deadline: float, outer: TwoLevel | None = None) -> Solution:
        """"infeasible" with the least peak the column ILP finds (an upper bound on the smallest budget), or
        that assignment as "feasible" where it fits. Its columns are `outer`'s, or by default the
        least-memory blocks (`_least_columns`): then the answer does not depend on the budget, and an
        earlier solve of this problem may have found it already (`memo`)."""
        ip = self.ip
        own = outer is None  # the least-memory columns: an answer independent of the budget ...
        # ... given the shared inputs this view folded (`fold_shared_inputs`, which the budget decides)
        key = (solver, tuple(v for v, _, _ in ip.shared))
        found = self.memo.least.get(key) if own else None
        if found is None:
            if own:
                self._least_columns(deadline)
                outer = self._outer(None, self.least_runs)
            least = outer.outer("memory", solver, deadline)
            found = LeastMemory(int(least.value), least.choice, least.ckpt, False,
                                "smallest feasible budget found by the priced search (an upper bound; not proven "
                                "minimal)") if least.res.x is not None else LeastMemory(
                                    None, [], [], False, f"least-memory solve failed: {least.res.message}")
            if own and not self._late(deadline) and least.res.x is not None:
                self.memo.least[key] = found
        base = dict(seconds=time.perf_counter() - start, solver=resolve_solver(solver), method="priced")
        sol = infeasible_or_fallback(ip, found, base, fits="the least-memory assignment (no priced search found "
                                                          "another that fits)")
        if sol.status == "feasible" and np.isfinite(self.best_bound):  # the prices' bound holds for it too
            sol.raise_bound(self.best_bound, GAP_TOLERANCE)
        return sol

    def _answer(self, r: Priced, start: float, status: str, gap: float, message: str, bound: float) -> Solution:
        return Solution(status=status, choice=dict(zip(self.ip.names, r.choice)),
                        checkpointed=[self.ip.block_names[b] for b in r.ckpt], objective=r.time_s, gap=gap,
                        seconds=time.perf_counter() - start, solver="dp", peak_bytes=r.peak, method="priced",
                        message=message, bound=bound)

    def _solution(self, choice: list[int], ckpt: list[int], value: float, start: float, gap: float,
                  solver: str, cut: bool, bound: float) -> Solution:
        ip = self.ip
        status = "optimal" if gap <= GAP_TOLERANCE else "feasible"
        notes = [] if status == "optimal" else [NOT_PROVEN]
        if cut:
            notes.append("a column ILP stopped at its node or stall limit")
        if self.stopped:
            notes.append("the time limit cut the search short")
        return Solution(status=status, choice=dict(zip(ip.names, choice)),
                        checkpointed=[ip.block_names[b] for b in ckpt], objective=value, gap=float(gap),
                        seconds=time.perf_counter() - start, solver=resolve_solver(solver),
                        peak_bytes=evaluate_indexed(ip, choice, ckpt)[1], method="priced", message="; ".join(notes),
                        bound=bound)

