"""A good assignment that fits the budget, for the flat ILP to start from (a MIP start).

When the blocks do not decompose (T5: each decoder block also reads the encoder output, and the first
block of each stack hands its position bias to the next), the flat ILP is the solver. On a large mesh it
is large (HF T5 on 2x2x2: 152k variables), and HiGHS spends its work budget in the root node's cut loop
before its own heuristics find a good answer. This module gives it one up front, by the same pricing as
the priced solve (`planner.search.solve.columns`) but over the whole problem at once:

* fix which blocks are checkpointed (none, or all of them): every node's cost is then a number per choice
  and every edge a matrix, so time + mu·additive bytes is minimised exactly by variable elimination
  (`planner.search.solve.eliminate`) over all nodes;
* search mu (grow tenfold until the minimiser's exact peak fits, then bisect), and under a few caps on
  the transient bytes (the max term, which prices do not see);
* keep the fastest assignment whose exact peak (`evaluate_indexed`'s, via `FastEvaluator`) fits.

It is a heuristic (no bound of its own): the ILP proves how far from optimal it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.search.solve.block_dp import Price
from planner.search.solve.eliminate import eliminate
from planner.search.solve.evaluate import FastEvaluator
from planner.search.solve.frontier import topological_order
from planner.search.solve.indexed import IndexedProblem

__all__ = ["Start", "Starts", "priced_costs", "priced_starts"]

_STEPS = 8  # bisection steps on log(mu) per search
_CAPS = 4  # transient caps tried below the answer's largest transient


@dataclass
class Start:
    """An assignment: choice per node, checkpointed block indices, its exact time and peak."""

    choice: list[int]
    ckpt: list[int]
    time_s: float
    peak: int


@dataclass
class Starts:
    """What the searches found: the fastest assignment that fits the budget (a start for the time ILP) and
    the one with the least peak (a start for the least-memory ILP); None when there is none."""

    fastest: Start | None
    least: Start | None


def priced_costs(ip: IndexedProblem, combos: list[tuple[float, Price, frozenset[int]]]
                 ) -> tuple[dict[int, np.ndarray], dict[int, list[tuple[int, np.ndarray]]]]:
    """The priced sum's unary and pairwise costs over the whole problem under each (floor, price, checkpointed
    blocks) of `combos` (the floor is only carried), stacked on a leading axis, as the priced sweeps price a
    block (`block_dp`): a·time + b·(state + saved, or a checkpointed block's input) + for a checkpointed
    block's nodes a·recompute + c·saved; choices whose transient is above the price's cap are forbidden. The
    minimisers here (c = 0) and reduced-cost fixing (`fixing.option_bounds`) sweep them."""
    a = np.array([p.a for _, p, _ in combos])[:, None]
    b = np.array([p.b for _, p, _ in combos])[:, None]
    c = np.array([p.c for _, p, _ in combos])[:, None]
    cap = np.array([p.cap for _, p, _ in combos])[:, None]
    inside = np.array([[ip.block_of[v] in ckpt for v in range(ip.n)] for _, _, ckpt in combos])  # (K, n)
    unary = {}
    for v in range(ip.n):
        kept = inside[:, v:v + 1]
        w = (a * (ip.time[v] + np.where(kept, ip.recompute[v], 0.0))
             + b * (ip.state[v] + np.where(kept, 0, ip.saved[v])).astype(float)
             + np.where(kept, c * ip.saved[v], 0.0))
        unary[v] = np.where(ip.transient[v] <= cap, w, np.inf)
    for blk, src in enumerate(ip.block_input):
        if src is not None:  # a checkpointed block keeps its input
            held = np.array([blk in ckpt for _, _, ckpt in combos])[:, None]
            unary[src] = unary[src] + np.where(held, b * ip.input_bytes[blk].astype(float), 0.0)
    incoming: dict[int, list[tuple[int, np.ndarray]]] = {v: [] for v in range(ip.n)}
    for e in ip.edges:
        kept = inside[:, e.dst][:, None, None]
        mat = a[:, :, None] * (e.cost + np.where(kept, e.recompute, 0.0))
        if e.saved is not None:
            mat = mat + b[:, :, None] * e.saved
        if e.transient is not None:
            mat = np.where(e.transient <= cap[:, :, None], mat, np.inf)
        incoming[e.dst].append((e.src, mat))
    return unary, incoming


class _Pricer:
    """Exact minimisers of time + mu·additive bytes for a set of checkpointed blocks and a transient cap
    (`minimise`), the search over mu (`search`), and every assignment found on the way (`results`)."""

    def __init__(self, ip: IndexedProblem) -> None:
        self.ip = ip
        self.order = topological_order(ip.n, [(e.src, e.dst) for e in ip.edges]) or list(range(ip.n))
        self.sizes = dict(enumerate(ip.sizes))
        self.memo: dict = {}
        self.results: list[Start] = []
        self.evaluate = FastEvaluator(ip)  # evaluate_indexed's figures, vectorised

    def minimise(self, ckpt: frozenset[int], mu: float, cap: float) -> Start | None:
        """The minimiser with blocks `ckpt` checkpointed and no transient above `cap`, evaluated exactly
        (None when the cap forbids every assignment)."""
        unary, incoming = priced_costs(self.ip, [(0.0, Price(1.0, mu, 0.0, cap), ckpt)])
        sweep = eliminate(self.order, self.sizes, unary, incoming, memo=self.memo, batch=1)
        if not np.isfinite(sweep.value[0]):
            return None
        ip = self.ip
        picked = sweep.at(0).argmin({})
        choice = [int(picked[v]) for v in range(ip.n)]
        blocks = sorted(ckpt)
        time_s, peak = self.evaluate(choice, blocks)
        out = Start(choice, blocks, time_s, int(peak))
        self.results.append(out)
        return out

    def search(self, ckpt: frozenset[int], cap: float, mu0: float, top: float) -> None:
        """Grow mu tenfold from mu0 until the minimiser fits (at most `top`), then bisect on log(mu)."""
        lo, mu, hi = 0.0, mu0, None
        while mu <= top:
            r = self.minimise(ckpt, mu, cap)
            if r is None:
                return
            if r.peak <= self.ip.budget:
                hi = mu
                break
            lo, mu = mu, mu * 10
        if hi is None:
            return
        for _ in range(_STEPS):
            if lo > 0 and hi / lo < 1.2:
                return
            mid = np.sqrt(lo * hi) if lo > 0 else hi / 10
            r = self.minimise(ckpt, mid, cap)
            if r is not None and r.peak <= self.ip.budget:
                hi = mid
            else:
                lo = mid

    def best(self) -> Start | None:
        fits = [r for r in self.results if r.peak <= self.ip.budget]
        return min(fits, key=lambda r: (r.time_s, r.peak), default=None)


def _caps(ip: IndexedProblem, choice: list[int]) -> list[float]:
    """Up to _CAPS transient levels just below the largest one `choice` uses."""
    works = [e for e in ip.edges if e.transient is not None]
    top = max([int(ip.transient[v][c]) for v, c in enumerate(choice)]
              + [int(e.transient[choice[e.src], choice[e.dst]]) for e in works], default=0)
    levels = np.unique(np.concatenate([t for t in ip.transient] + [e.transient.ravel() for e in works]))
    return [float(x) for x in levels[levels < top][::-1][:_CAPS]]


def priced_starts(ip: IndexedProblem) -> Starts:
    """The fastest assignment the priced searches find that fits `ip.budget`, and the least peak they find."""
    pricer = _Pricer(ip)
    scale = max(ip.time_magnitude(), 1e-30) / max(ip.budget, 1)  # seconds per budget byte, at most
    mu0, top = scale * 1e-4, scale * 1e8
    sets = [frozenset()] + ([frozenset(range(len(ip.block_nodes)))] if ip.checkpointing and ip.block_nodes else [])
    for ckpt in sets:
        pricer.search(ckpt, np.inf, mu0, top)
    anchor = pricer.best() or min(pricer.results, key=lambda r: r.peak, default=None)
    if anchor is not None:
        for cap in _caps(ip, anchor.choice):
            for ckpt in sets:
                pricer.search(ckpt, cap, mu0, top)
    return Starts(pricer.best(), min(pricer.results, key=lambda r: (r.peak, r.time_s), default=None))
