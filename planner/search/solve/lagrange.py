"""Lagrangian lower bounds that let the two-level solve skip most of a block's Pareto frontier.

Relaxing the memory row with a multiplier mu >= 0 turns "fastest step under the budget" into an
unconstrained sum: every block instance costs w = time + mu·additive_bytes and the problem pays
mu·(T - R) for its max term T. For any feasible answer x with objective z(x):

    z(x) >= sum of w over x's blocks + outer nodes' w + mu·T - mu·R.

The bound is made tight where it matters: T is split into buckets (L_{j-1}, L_j] over every value the
max term can take; inside bucket j every op's transient and every checkpointed block's recomputed bytes
are at most L_j, and mu·T >= mu·L_{j-1}. Each segment of m identical blocks is a walk through the output
node's choices, so the least w of k blocks ending at choice p (`fwd`) and of k blocks starting at q
(`bwd`) follow from the cheapest block per boundary (p, q) and bucket, found by small dynamic programs:
over transient levels for plain blocks and over recomputed-byte buckets for checkpointed ones (bytes
rounded down and transients of checkpointed blocks not limited: relaxations, so still a lower bound). A
segment's walk starts at its port's choice and ends by paying its cheapest edges to outer nodes for that
output choice; other outer nodes and edges count at their least (relaxations again).

A frontier label (part of one block) is then bounded by its own w, the cheapest completion of the block
from its state to each output choice q (`completion`), and the best rest of the problem given (p, q) and a
bucket at least as high as the label's max-term bytes. Labels whose bound exceeds a target objective can
be dropped: no answer better than the target uses them. With mu = 0 and unit weight on memory the same
machinery bounds the least peak memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.search.solve.decompose import Decomposition, Segment
from planner.search.solve.frontier import BlockShape, FrontierTooLarge, Prune, SweepPlan, plan_sweep
from planner.search.solve.indexed import IndexedProblem

__all__ = ["Weights", "LagrangeBound", "best_multiplier"]

S_BUCKETS = 256  # most recomputed-byte buckets per checkpointed class
T_STEPS = 256  # evenly spaced max-term values added to the bucket grid
_FINE_CELLS = 4_000_000  # target size of one DP tensor for the exact bound
_COARSE_CELLS = 500_000  # ... and for the multiplier search
# ... which cannot shrink below the block's widest sweep state x port choices x 4 levels: past this many
# numbers (8 bytes each) the bound is refused (`FrontierTooLarge`) instead of allocated. HF LLaMA's layer
# on 2x2x2 needs 2.2e9 (17.5 GiB per tensor; the process was killed for memory).
_MAX_CELLS = 50_000_000


@dataclass(frozen=True)
class Weights:
    """Objective of the relaxation: a·time + b·bytes - r (time mode: (1, mu, mu·R); memory: (0, 1, 0))."""

    a: float
    b: float
    r: float


def _node_w(shape: BlockShape, v: int, w: Weights, ckpt: bool) -> np.ndarray:
    time = shape.time[v] + (shape.recompute[v] if ckpt else 0.0)
    mem = shape.state[v] + (0 if ckpt else shape.saved[v])
    return w.a * time + w.b * mem.astype(float)


def _edge_w(cost: np.ndarray, rec: np.ndarray, w: Weights, ckpt: bool) -> np.ndarray:
    return w.a * (cost + rec) if ckpt else w.a * cost


def _at(arr: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """arr (s, *extra) reshaped to sit on node axis `axis` of `ndim` node axes, before the extra dims."""
    return arr.reshape((1,) * axis + arr.shape[:1] + (1,) * (ndim - axis - 1) + arr.shape[1:])


def _at2(mat: np.ndarray, iu: int, iv: int, ndim: int, n_extra: int) -> np.ndarray:
    """mat (s_u, s_v) on node axes iu and iv of `ndim` node axes, broadcast over n_extra extra dims."""
    if iu > iv:
        mat, iu, iv = mat.T, iv, iu
    shape = [1] * ndim
    shape[iu], shape[iv] = mat.shape
    return mat.reshape(shape + [1] * n_extra)


def _expand(arr: np.ndarray, axes: list[int], target: list[int]) -> np.ndarray:
    """Insert size-1 node axes so that arr over `axes` (sorted subset of `target`) broadcasts over target."""
    for k, ax in enumerate(target):
        if ax not in axes:
            arr = np.expand_dims(arr, k)
    return arr


def _forward(shape: BlockShape, plan: SweepPlan, w: Weights, ckpt: bool, init: np.ndarray,
             node_extra: list[np.ndarray], shifts: list[np.ndarray] | None) -> np.ndarray:
    """Variable elimination over the sweep; extra dims (P, E) ride along. node_extra[v] is (s_v, E): the
    node's w (inf where a level forbids the choice); shifts[v][c] moves the last dim by that many buckets.
    Returns (Q, P, E)."""
    V, axes = init, []
    for i, v in enumerate(plan.order):
        new_axes = sorted(axes + [v])
        k, nd = new_axes.index(v), len(new_axes)
        if shifts is None:
            X = np.expand_dims(V, k)
        else:  # choice c moves the bucket axis up by shifts[v][c]; buckets shifted in from below are empty
            G = V.shape[-1]
            idx = np.arange(G)[None, :] - shifts[v][:, None]  # (s_v, G)
            padded = np.concatenate([V, np.full(V.shape[:-1] + (1,), np.inf)], axis=-1)
            X = np.moveaxis(padded[..., np.where(idx >= 0, idx, G)], -2, k)
        port = w.a * (plan.port[v][0] + (plan.port[v][1] if ckpt else 0.0)).T  # (s_v, P)
        X = X + _at(node_extra[v][:, None, :] + port[:, :, None], k, nd)
        for u, cost, rec in plan.incoming[v]:
            X = X + _at2(_edge_w(cost, rec, w, ckpt), new_axes.index(u), k, nd, 2)
        drop = tuple(j for j, ax in enumerate(new_axes) if ax not in plan.live[i])
        V, axes = (X.min(axis=drop) if drop else X), plan.live[i]
    return V if axes else V[None]


def completion(shape: BlockShape, plan: SweepPlan, w: Weights, ckpt: bool) -> list[np.ndarray]:
    """tables[i][key] -> (Q, P): least w of the nodes after sweep step i given the live choices `key`,
    ending with output choice q, for port choice p."""
    n, P = len(plan.order), shape.port_size
    Q = 1 if shape.out_pos is None else shape.sizes[shape.out_pos]
    tables: list[np.ndarray] = [np.empty(0)] * n
    if shape.out_pos is None:
        phi = np.zeros((Q, P))
    else:
        phi = np.repeat(np.where(np.eye(Q, dtype=bool), 0.0, np.inf)[:, :, None], P, axis=2)
    tables[n - 1] = phi
    for i in range(n - 1, 0, -1):
        v, prev = plan.order[i], plan.live[i - 1]
        new_axes = sorted(prev + [v])
        k, nd = new_axes.index(v), len(new_axes)
        X = _expand(phi, plan.live[i], new_axes)
        port = w.a * (plan.port[v][0] + (plan.port[v][1] if ckpt else 0.0)).T  # (s_v, P)
        X = X + _at(_node_w(shape, v, w, ckpt)[:, None, None] + port[:, None, :], k, nd)
        for u, cost, rec in plan.incoming[v]:
            X = X + _at2(_edge_w(cost, rec, w, ckpt), new_axes.index(u), k, nd, 2)
        phi = X.min(axis=k)
        tables[i - 1] = phi
    return tables


def _widest(shape: BlockShape, plan: SweepPlan) -> int:
    """The most node-choice combinations any sweep step holds at once."""
    prev: list[int] = []
    widest = 1
    for i, v in enumerate(plan.order):
        widest = max(widest, int(np.prod([shape.sizes[u] for u in set(prev) | {v}])))
        prev = plan.live[i]
    return widest


class _ClassGrid:
    """Per class: transient levels, recomputed-byte buckets and the sweep plan (independent of weights).

    Level and bucket counts are sized so that the DP tensors (states x port choices x levels) stay near
    `cells` numbers. With every transient value as a level the plain-block bound is exact per bucket;
    fewer levels stand for "transient at most the next level up" and fewer recomputed-byte buckets round
    more bytes down: weaker but still valid bounds. The coarse grid (for the multiplier search) is smaller
    still."""

    def __init__(self, shape: BlockShape, checkpointing: bool, grid: np.ndarray, coarse: bool = False) -> None:
        self.shape, self.plan, self.ckpt = shape, plan_sweep(shape), checkpointing
        widest = _widest(shape, self.plan) * shape.port_size
        if widest * 8 > _MAX_CELLS:  # the fewest levels and buckets a grid keeps
            raise FrontierTooLarge(
                f"the block's Lagrangian bound needs over {widest * 8:,} numbers per DP tensor ({widest:,} choice "
                f"combinations held at once x levels; at most {_MAX_CELLS:,}): too many of its ops' choices stay "
                "live together for the two-level solve; use method='priced' (the default for repeated blocks) "
                "or 'flat'")
        room = max(1, (_COARSE_CELLS if coarse else _FINE_CELLS) // widest)
        levels = np.unique(np.concatenate(shape.transient)).astype(float)
        keep = max(4, min(room, 12 if coarse else len(levels)))
        if keep < len(levels):
            levels = np.unique(np.quantile(levels, np.linspace(0, 1, keep), method="higher"))
            self.lx = np.minimum(np.searchsorted(levels, grid, side="left"), len(levels) - 1)
        else:
            self.lx = np.searchsorted(levels, grid, side="right") - 1
        self.x_levels = levels
        most = S_BUCKETS // 8 if coarse else S_BUCKETS
        buckets = int(min(most, max(8, 2 ** int(np.log2(room)))))
        s_max = float(sum(int(s.max()) for s in shape.saved))
        self.buckets = buckets
        self.delta = max(s_max / (buckets - 1), 1.0)
        self.shifts = [np.floor(s / self.delta).astype(int) for s in shape.saved]
        self.gs = np.minimum(np.floor(grid / self.delta).astype(int), buckets - 1)
        self.grid = grid

    def s_values(self) -> np.ndarray:
        return np.arange(self.buckets) * self.delta if self.ckpt else np.zeros(0)

    def arcs(self, w: Weights) -> np.ndarray:
        """(J, P, Q): least w of one block per bucket of the grid and boundary (p, q)."""
        sh, P = self.shape, self.shape.port_size
        node = [np.where(sh.transient[v][:, None] <= self.x_levels[None, :], _node_w(sh, v, w, False)[:, None],
                         np.inf) for v in range(len(sh.sizes))]
        plain = _forward(sh, self.plan, w, False, np.zeros((P, len(self.x_levels))), node, None)
        plain = np.concatenate([plain, np.full(plain.shape[:2] + (1,), np.inf)], axis=2)  # index -1: none
        best = plain[:, :, self.lx]  # (Q, P, J)
        if self.ckpt:
            kept_in = w.b * sh.input_bytes.astype(float)[None, :, None]
            init = np.full((P, self.buckets), np.inf)
            init[:, 0] = 0.0
            node = [_node_w(sh, v, w, True)[:, None] * np.ones((1, self.buckets)) for v in range(len(sh.sizes))]
            kept = _forward(sh, self.plan, w, True, init, node, self.shifts)
            kept = (np.minimum.accumulate(kept, axis=2) + kept_in)[:, :, self.gs]  # (Q, P, J)
            # a second bound for "recomputed bytes S <= L": max over nu >= 0 of min(w + nu·S) - nu·L
            nus = self._nus(w)
            node = [_node_w(sh, v, w, True)[:, None] + sh.saved[v].astype(float)[:, None] * nus[None, :]
                    for v in range(len(sh.sizes))]
            priced = _forward(sh, self.plan, w, True, np.zeros((P, len(nus))), node, None) + kept_in  # (Q, P, E)
            dual = np.max(priced[:, :, None, :] - nus[None, None, None, :] * self.grid[None, None, :, None], axis=3)
            best = np.minimum(best, np.maximum(kept, dual))
        return np.transpose(best, (2, 1, 0))

    def _nus(self, w: Weights) -> np.ndarray:
        """Multipliers for the recomputed-bytes bound: 0 and a geometric range around the price of a byte."""
        sh = self.shape
        scale = w.b if w.b > 0 else w.a * sum(float(t.max()) for t in sh.time) / max(
            1.0, float(sum(int(s.max()) for s in sh.saved)))
        return np.concatenate([[0.0], scale * 4.0 ** np.arange(-6, 7)]) if scale > 0 else np.zeros(1)


def _walks(W: np.ndarray, m: int, start: np.ndarray, end: np.ndarray, with_h: bool
           ) -> tuple[np.ndarray, np.ndarray | None]:
    """For arcs W (J, P, Q), m blocks and boundary potentials start (J, P), end (J, Q): the least w of a
    walk (J,), and with `with_h` also H (J, P, Q): the least w of everything in the segment but one block
    with boundary (p, q), over that block's positions."""
    fwd, bwd = [start], [end]
    for _ in range(m - 1):
        fwd.append(np.min(fwd[-1][:, :, None] + W, axis=1))
        if with_h:
            bwd.append(np.min(W + bwd[-1][:, None, :], axis=2))
    total = np.min(np.min(fwd[-1][:, :, None] + W, axis=1) + end, axis=1)
    if not with_h:
        return total, None
    H = np.full(W.shape, np.inf)
    for k in range(m):
        H = np.minimum(H, fwd[k][:, :, None] + bwd[m - 1 - k][:, None, :])
    return total, H


class LagrangeBound:
    """Bounds for one problem decomposition; `evaluate(w)` sets the weights and returns the lower bound."""

    def __init__(self, ip: IndexedProblem, dec: Decomposition) -> None:
        self.ip, self.dec = ip, dec
        self.floor = max((float(t.min()) for t in ip.transient), default=0.0)
        values = [t.astype(float) for t in ip.transient] + [np.array([self.floor])] + [
            e.transient.ravel().astype(float) for e in ip.edges if e.transient is not None]  # conversions
        grid0 = np.unique(np.concatenate(values))
        self.classes = [_ClassGrid(c.shape, ip.checkpointing, grid0) for c in dec.classes]
        top = max([float(grid0.max())] + [float(c.s_values().max(initial=0.0)) for c in self.classes])
        even = np.linspace(self.floor, top, T_STEPS + 1)  # the bound pays mu·L_{j-1}: keep buckets narrow
        grid = np.unique(np.concatenate([grid0, even] + [c.s_values() for c in self.classes]))
        self.grid = grid[grid >= self.floor]
        self.classes = [_ClassGrid(c.shape, ip.checkpointing, self.grid) for c in dec.classes]
        self.coarse = [_ClassGrid(c.shape, ip.checkpointing, self.grid, coarse=True) for c in dec.classes]
        self.prev = np.concatenate([[self.floor], self.grid[:-1]])
        self._port_uses: dict[int | None, int] = {}
        for seg in dec.segments:
            self._port_uses[seg.port] = self._port_uses.get(seg.port, 0) + 1
        self.weights = Weights(1.0, 0.0, 0.0)
        self.lower = -np.inf

    def evaluate(self, w: Weights, keep: bool = False, coarse: bool = False) -> float:
        """The lower bound for weights w; with keep=True also store what `prune` needs (exact grid only);
        coarse=True uses the cheaper, weaker grid."""
        ip, dec = self.ip, self.dec
        J = len(self.grid)
        outer = np.zeros(J)
        own: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # outer node -> (w per bucket and choice, least)
        for v in dec.outer_nodes:
            node_w = w.a * ip.time[v] + w.b * (ip.state[v] + ip.saved[v]).astype(float)
            per = np.where(ip.transient[v][None, :] <= self.grid[:, None], node_w[None, :], np.inf)
            own[v] = (per, per.min(axis=1))
            outer += own[v][1]
        outer += sum(w.a * float(e.cost.min()) + (0.0 if e.saved is None else w.b * float(e.saved.min()))
                     for e in ip.edges if ip.block_of[e.dst] < 0)
        arcs = [c.arcs(w) for c in (self.coarse if coarse and not keep else self.classes)]
        walks = [_walks(arcs[seg.cls], len(seg.blocks), *self._potentials(seg, w, own), keep) for seg in dec.segments]
        base = outer + w.b * self.prev - w.r
        total = base + sum((t for t, _ in walks), np.zeros(len(self.grid)))
        self.weights, self.lower = w, float(np.min(total))
        if keep:
            self._rest = []
            for cls in range(len(self.classes)):
                shape = self.classes[cls].shape
                q = 1 if shape.out_pos is None else shape.sizes[shape.out_pos]
                best = np.full((len(self.grid), shape.port_size, q), np.inf)
                for g, (seg, (_, H)) in enumerate(zip(dec.segments, walks)):
                    if seg.cls == cls:
                        others = base + sum((t for h, (t, _) in enumerate(walks) if h != g), np.zeros(len(self.grid)))
                        best = np.minimum(best, H + others[:, None, None])
                self._rest.append(np.minimum.accumulate(best[::-1], axis=0)[::-1])  # suffix minimum over buckets
            self._tables = [[completion(c.shape, c.plan, w, ck) for ck in (False, True)] for c in self.classes]
        return self.lower

    def _potentials(self, seg: Segment, w: Weights, own: dict[int, tuple[np.ndarray, np.ndarray]]
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Boundary potentials of a segment (J, P) and (J, Q): what its port's own choice costs above that
        node's least (when the port is an outer node feeding only this segment), and what the edges from
        its output node to outer nodes cost above their least, given the output choice."""
        ip, J = self.ip, len(self.grid)
        shape = self.dec.classes[seg.cls].shape
        start = np.zeros((J, shape.port_size))
        if seg.port in own and self._port_uses[seg.port] == 1:
            per, least = own[seg.port]
            start = np.where(np.isfinite(least)[:, None], per - np.where(np.isfinite(least), least, 0.0)[:, None], 0.0)
        end = np.zeros((J, 1 if seg.out is None else ip.sizes[seg.out]))
        for e in ip.edges:
            if e.src == seg.out and ip.block_of[e.dst] < 0:
                end = end + w.a * (e.cost.min(axis=1) - e.cost.min())[None, :]
        return start, end

    def prune(self, cls: int, target: float) -> Callable[[int, bool], Prune]:
        """prune(p, ckpt) -> label filter for class `cls`: keeps labels whose bound is <= target."""
        w, shape = self.weights, self.classes[cls].shape
        rest, tables = self._rest[cls], self._tables[cls]
        tol = 1e-9 * (abs(target) + abs(w.r)) + 1e-12

        def factory(p: int, ckpt: bool) -> Prune:
            kept = w.b * float(shape.input_bytes[p]) if ckpt else 0.0

            def keep(i: int, keys: np.ndarray, vals: np.ndarray) -> np.ndarray:
                own = w.a * vals[:, 3] + w.b * vals[:, 0] + kept
                # the label's largest working set, or its recompute peak so far (at least what it has
                # recomputed): a floor of the answer's max term. A recompute peak can pass the grid's top
                # (every transient, every recomputed-byte bucket): the last bucket's bound holds there
                # (its limits hold for every answer).
                top = np.maximum(vals[:, 2], self.floor)
                j = np.minimum(np.searchsorted(self.grid, top, side="left"), len(self.grid) - 1)
                table = tables[ckpt][i]  # live choices... x (Q, P)
                phi = table[tuple(keys.T)][:, :, p] if keys.shape[1] else np.broadcast_to(table[:, p], (len(vals),
                                                                                                         table.shape[0]))
                bound = own + np.min(phi + rest[j, p, :], axis=1)
                return bound <= target + tol

            return keep

        return factory


def _golden(value: Callable[[float], float], lo: float, hi: float, iterations: int) -> None:
    """Golden-section search for the maximum of a concave function on [lo, hi] (values land in its cache)."""
    ratio = (np.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    for _ in range(iterations):
        if value(a) < value(b):
            lo, a, b = a, b, a + ratio * (hi - a)
        else:
            hi, b, a = b, a, b - ratio * (b - lo)


def best_multiplier(bound: LagrangeBound, budget: int, iterations: int = 24) -> float:
    """The memory multiplier mu maximising the (concave) time-mode bound: a golden-section search on the
    coarse grid, then a few steps on the exact grid around its answer."""
    caches: tuple[dict[float, float], dict[float, float]] = ({}, {})

    def value(mu: float, coarse: bool = True) -> float:
        cache = caches[coarse]
        if mu not in cache:
            cache[mu] = bound.evaluate(Weights(1.0, mu, mu * budget), coarse=coarse)
        return cache[mu]

    lo, hi = 0.0, bound.ip.time_magnitude() / max(budget, 1)
    if value(hi * 1e-4) <= value(0.0):  # the bound falls from mu = 0 on: memory does not bind
        return 0.0
    while value(hi) > value(lo) and hi < 1e12:  # grow until the bound falls again
        lo, hi = hi, hi * 4
    _golden(value, lo / 4 if lo > 0 else 0.0, hi, iterations)
    mu = max(caches[True], key=caches[True].get)
    _golden(lambda x: value(x, coarse=False), mu / 1.5, mu * 1.5, 6)
    return max(caches[False], key=caches[False].get)
