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

from planner.search.solve.eliminate import eliminate
from planner.search.solve.evaluate import FastEvaluator
from planner.search.solve.frontier import topological_order
from planner.search.solve.indexed import IndexedProblem

__all__ = ["Start", "Starts", "priced_starts"]

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
        ip = self.ip
        in_ckpt = [ip.block_of[v] in ckpt for v in range(ip.n)]
        unary: dict[int, np.ndarray] = {}
        for v in range(ip.n):
            secs = ip.time[v] + (ip.recompute[v] if in_ckpt[v] else 0.0)
            mem = ip.state[v] + (0 if in_ckpt[v] else ip.saved[v])
            unary[v] = np.where(ip.transient[v] <= cap, secs + mu * mem.astype(float), np.inf)
        for b in ckpt:  # a checkpointed block keeps its input
            src = ip.block_input[b]
            if src is not None:
                unary[src] = unary[src] + mu * ip.input_bytes[b].astype(float)
        incoming: dict[int, list[tuple[int, np.ndarray]]] = {v: [] for v in range(ip.n)}
        for e in ip.edges:
            mat = e.cost + (e.recompute if in_ckpt[e.dst] else 0.0) + (0.0 if e.saved is None else mu * e.saved)
            if e.transient is not None:
                mat = np.where(e.transient <= cap, mat, np.inf)
            incoming[e.dst].append((e.src, mat))
        sweep = eliminate(self.order, self.sizes, unary, incoming, memo=self.memo)
        if not np.isfinite(sweep.value):
            return None
        picked = sweep.argmin({})
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
