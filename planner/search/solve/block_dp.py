"""The cheapest way to run a block for every boundary (port choice p, output choice q), under one price.

A price says what a second of step time, a byte of additive memory and a byte a checkpointed block
recomputes are worth against each other (`Price`); under it a block's cost is one number per boundary,
so the best internal assignment of each (p, q) follows from exact variable elimination
(`planner.search.solve.eliminate`). A transformer layer is swept in pieces: wherever a single tensor carries
everything later nodes need (the residual stream after an add), the sweep is cut and the pieces are
joined by min-plus products, so the port's choice is only carried through the first piece.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.search.solve.eliminate import Sweep, eliminate
from planner.search.solve.evaluate import recompute_peak
from planner.search.solve.frontier import BlockShape, FrontierPoint, plan_sweep

__all__ = ["Price", "BlockDP", "BlockTable", "allowed"]

PORT = -1  # node id of the block's port in the sweeps


@dataclass(frozen=True)
class Price:
    """Weights of one scalarisation: a per second, b per additive byte, c per byte a checkpointed block
    recomputes (its candidate for the max term); choices with a transient above `cap` are forbidden, and
    with `only` a labelled node keeps the options with those labels (a uniform-scheme search)."""

    a: float
    b: float
    c: float = 0.0
    cap: float = np.inf
    only: tuple[str, ...] = ()  # labels: a labelled node with options so labelled takes one of them


def allowed(labels: np.ndarray | None, only: tuple[str, ...]) -> np.ndarray | None:
    """The options a node may take under `only` (None: all)."""
    if not only or labels is None:
        return None
    mask = np.isin(labels, only)
    return mask if mask.any() else None


@dataclass
class BlockTable:
    """The cheapest block per boundary under one price: `cost[p, q]`, `ckpt[p, q]` (whether that
    cheapest way is checkpointed), and `choice(p, q)` -> (N, n) node choices by block position."""

    cost: np.ndarray
    ckpt: np.ndarray
    parts: tuple[list, list]  # per checkpoint flag: (sweeps, joins) to read choices back

    def choice(self, p: np.ndarray, q: np.ndarray, ckpt: np.ndarray, n: int) -> np.ndarray:
        out = np.zeros((len(p), n), dtype=np.int64)
        for flag in (False, True):
            sel = np.flatnonzero(ckpt == flag)
            if len(sel):
                out[sel] = _read_back(*self.parts[flag], p[sel], q[sel], n)
        return out


def _read_back(pieces: list[tuple[int, int | None, bool, Sweep]], joins: list[np.ndarray], p: np.ndarray,
               q: np.ndarray, n: int) -> np.ndarray:
    """Node choices of the cheapest block for boundaries (p, q), from the pieces' sweeps and the argmins
    of the min-plus joins between them."""
    ends = [q]
    for arg in reversed(joins):  # joins[k][p, x]: the cut choice before piece k+1 on the way to x
        ends.append(arg[p, ends[-1]])
    ends = ends[::-1]  # ends[k]: the choice of piece k's last node
    out = np.zeros((len(p), n), dtype=np.int64)
    for k, (carried, last, with_port, sweep) in enumerate(pieces):
        given = {carried: p if k == 0 else ends[k - 1]}
        if with_port:
            given[PORT] = p
        if last is not None:
            given[last] = ends[k]
        for node, idx in sweep.argmin(given).items():
            if node >= 0:
                out[:, node] = idx
    return out


class BlockDP:
    """Per block class: the sweep order, its cut points, and `table(price)`."""

    def __init__(self, shape: BlockShape) -> None:
        self.shape = shape
        plan = plan_sweep(shape)  # checks the edges are acyclic; sums the port's edges per node
        self.n = len(shape.sizes)
        self.out = shape.out_pos
        self.sizes = {v: s for v, s in enumerate(shape.sizes)} | {PORT: shape.port_size}
        self._memo: dict = {}  # compiled eliminations of this block's pieces (see eliminate's memo)
        self.internal = shape.internal
        self.port = {v: plan.port[v] for v in range(self.n) if plan.port[v][0].any() or plan.port[v][1].any()}
        self.uses_port = set(self.port) | set(shape.port_work)  # nodes with an edge from the port
        self.order, live = self._order()
        self.pieces = self._cut(live)

    def _order(self) -> tuple[list[int], list[list[int]]]:
        """A topological order that keeps the sweep's tables small (greedy: next, the ready node that
        gives the smallest table), and the nodes still needed after each step."""
        succ: dict[int, set[int]] = {v: set() for v in range(self.n)}
        preds: dict[int, set[int]] = {v: set() for v in range(self.n)}
        for s, d, _, _ in self.internal:
            succ[s].add(d)
            preds[d].add(s)
        placed: set[int] = set()
        axes: set[int] = set()
        order, live = [], []

        def needed(nodes: set[int], done: set[int]) -> set[int]:
            return {u for u in nodes if u == self.out or not succ[u] <= done}

        def size(v: int, axes: set[int]) -> tuple[float, float, int]:
            now = axes | {v}
            after = needed(now, placed | {v})
            return float(np.prod([self.sizes[u] for u in now])), float(np.prod([self.sizes[u] for u in after])), v

        while len(order) < self.n:
            ready = [v for v in range(self.n) if v not in placed and preds[v] <= placed]
            v = min(ready, key=lambda v: size(v, axes))
            placed.add(v)
            order.append(v)
            axes = needed(axes | {v}, placed)
            live.append(sorted(axes))
        return order, live

    def _cut(self, live: list[list[int]]) -> list[tuple[int, list[int], int | None, bool]]:
        """(carried node, nodes swept, last node kept, whether the port is needed) per piece: cut after a
        step when one node other than the output carries everything later steps need besides the port.
        Only pieces with edges from the port carry its axis, so a transformer layer's attention, between
        the port's two uses (the first norm and the residual add), is swept without it."""
        pieces, carried, start = [], PORT, 0
        for i in range(len(self.order) - 1):
            if len(live[i]) == 1 and live[i][0] != self.out and live[i][0] != carried:
                nodes = self.order[start:i + 1]
                pieces.append((carried, nodes, live[i][0], carried != PORT and any(v in self.uses_port for v in nodes)))
                carried, start = live[i][0], i + 1
        nodes = self.order[start:]
        pieces.append((carried, nodes, self.out, carried != PORT and any(v in self.uses_port for v in nodes)))
        return pieces

    def _sweep_inputs(self, price: Price, ckpt: bool) -> tuple[dict, dict]:
        sh, a = self.shape, price.a
        unary = {}
        for v in range(self.n):
            time = sh.time[v] + (sh.recompute[v] if ckpt else 0.0)
            mem = sh.state[v] + (0 if ckpt else sh.saved[v])
            w = a * time + price.b * mem.astype(float) + (price.c * sh.saved[v] if ckpt else 0.0)
            unary[v] = np.where(sh.transient[v] <= price.cap, w, np.inf)
            mask = allowed(sh.labels[v] if sh.labels else None, price.only)
            if mask is not None:
                unary[v] = np.where(mask, unary[v], np.inf)
        incoming: dict[int, list[tuple[int, np.ndarray]]] = {v: [] for v in range(self.n)}
        for s, d, cost, rec in self.internal:
            mat = a * (cost + rec) if ckpt else a * cost
            work = sh.internal_work.get((s, d))
            incoming[d].append((s, mat if work is None else np.where(work <= price.cap, mat, np.inf)))
        for v in set(self.port) | set(sh.port_work):
            cost, rec = self.port.get(v, (np.zeros((sh.port_size, sh.sizes[v])),) * 2)
            mat = a * (cost + rec) if ckpt else a * cost
            work = sh.port_work.get(v)
            incoming[v].append((PORT, mat if work is None else np.where(work <= price.cap, mat, np.inf)))
        return unary, incoming

    def _one(self, price: Price, ckpt: bool) -> tuple[np.ndarray, list, list]:
        unary, incoming = self._sweep_inputs(price, ckpt)
        pieces, joins, total = [], [], None
        for carried, nodes, last, with_port in self.pieces:
            start = [carried] + ([PORT] if with_port else [])
            sweep = eliminate(nodes, self.sizes, unary, incoming, keep=start + ([last] if last is not None else []),
                              start=start, memo=self._memo)
            table = sweep.value if last is not None else sweep.value[..., None]
            pieces.append((carried, last, with_port, sweep))
            if total is None:  # (port, last)
                total = table
                continue
            # min-plus join through the cut node's choice: (port, cut) + (cut, last) or (cut, port, last)
            step = np.transpose(table, (1, 0, 2)) if with_port else table[None, :, :]
            both = total[:, :, None] + step
            arg = np.argmin(both, axis=1)
            joins.append(arg)
            total = np.take_along_axis(both, arg[:, None, :], axis=1)[:, 0, :]
        if ckpt:
            total = total + price.b * self.shape.input_bytes.astype(float)[:, None]
        return total, pieces, joins

    def table(self, price: Price, checkpointing: bool) -> BlockTable:
        plain, pieces0, joins0 = self._one(price, False)
        if not checkpointing:
            return BlockTable(plain, np.zeros(plain.shape, dtype=bool), ((pieces0, joins0), ([], [])))
        kept, pieces1, joins1 = self._one(price, True)
        return BlockTable(np.minimum(plain, kept), kept < plain, ((pieces0, joins0), (pieces1, joins1)))

    def points(self, table: BlockTable, pairs: np.ndarray | None = None, both: bool = False) -> list[FrontierPoint]:
        """Frontier points (exact bytes and time) of the cheapest block of each finite (p, q) of `pairs`
        (all when None); with `both`, the cheapest plain and the cheapest checkpointed block each."""
        if pairs is None:
            pairs = np.argwhere(np.isfinite(table.cost))
        if len(pairs) == 0:
            return []
        p, q = pairs[:, 0], pairs[:, 1]
        flags = [table.ckpt[p, q]] if not both else [np.zeros(len(p), bool)] + (
            [np.ones(len(p), bool)] if table.parts[1][0] else [])
        out = []
        for ck in flags:
            choice = table.choice(p, q, ck, self.n)
            add, top, time = self.measure(choice, p, ck)
            ok = np.isfinite(time)
            out += [FrontierPoint(pp, qq, c, a_, t_, s_, tuple(ch))  # tolist(): plain ints and floats, fast
                    for pp, qq, c, a_, t_, s_, ch, good in zip(p.tolist(), q.tolist(), ck.tolist(), add.tolist(),
                                                               top.tolist(), time.tolist(), choice.tolist(), ok.tolist())
                    if good]
        return out

    def measure(self, choice: np.ndarray, p: np.ndarray, ckpt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact (additive bytes, max-term bytes, time) of blocks with these node choices."""
        sh = self.shape
        time = np.zeros(len(p))
        rec = np.zeros(len(p))
        state = np.zeros(len(p), dtype=np.int64)
        saved = np.zeros(len(p), dtype=np.int64)
        work = [sh.transient[v][choice[:, v]] for v in range(self.n)]  # per node: its or a conversion's into it
        for (s, d), w in sh.internal_work.items():  # conversion working sets join the max term
            work[d] = np.maximum(work[d], w[choice[:, s], choice[:, d]])
        for d, w in sh.port_work.items():
            work[d] = np.maximum(work[d], w[p, choice[:, d]])
        for v in range(self.n):
            c = choice[:, v]
            time += sh.time[v][c]
            rec += sh.recompute[v][c]
            state += sh.state[v][c]
            saved += sh.saved[v][c]
        for s, d, cost, r in self.internal:
            time += cost[choice[:, s], choice[:, d]]
            rec += r[choice[:, s], choice[:, d]]
        for v, (cost, r) in self.port.items():
            time += cost[p, choice[:, v]]
            rec += r[p, choice[:, v]]
        add = np.where(ckpt, state + sh.input_bytes[p], state + saved)
        # positions are the block's order: a checkpointed block's recompute peak (problem.py), else its
        # largest working set
        top = np.where(ckpt, recompute_peak([sh.saved[v][choice[:, v]] for v in range(self.n)], work),
                       np.max(work, axis=0))
        return add, top, np.where(ckpt, time + rec, time)
