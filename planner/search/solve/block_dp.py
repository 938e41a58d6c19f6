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

from planner.search.solve.eliminate import Sweep, at_argmin, eliminate
from planner.search.solve.evaluate import recompute_peak
from planner.search.solve.frontier import BlockShape, FrontierPoint, plan_sweep, undominated_rows

__all__ = ["Price", "BlockDP", "BlockTable", "Pin", "allowed", "forbid"]

PORT = -1  # node id of the block's port in the sweeps
Pin = tuple[int, np.ndarray]  # (block position, the options its node may take as a mask): a price's `pin` in a class


@dataclass(frozen=True)
class Price:
    """Weights of one scalarisation: a per second, b per additive byte, c per byte a checkpointed block
    recomputes (its candidate for the max term); choices with a transient above `cap` are forbidden, with
    `only` a labelled node keeps the options with those labels (a uniform-scheme search), and with `pin`
    one node keeps the options listed (`planner.search.solve.pinned`; a node inside a block pins that
    position in every block of its class, whose blocks share one table)."""

    a: float
    b: float
    c: float = 0.0
    cap: float = np.inf
    only: tuple[str, ...] = ()  # labels: a labelled node with options so labelled takes one of them
    pin: tuple[int, tuple[int, ...]] | None = None  # (node, the options it may take)


def allowed(labels: np.ndarray | None, only: tuple[str, ...]) -> np.ndarray | None:
    """The options a node may take under `only` (None: all)."""
    if not only or labels is None:
        return None
    mask = np.isin(labels, only)
    return mask if mask.any() else None


def forbid(costs: np.ndarray, masks: list[np.ndarray | None]) -> np.ndarray:
    """`costs` (one row of a node's options per price) with the options each price's mask (`allowed`, None:
    all) leaves out at infinity."""
    if all(m is None for m in masks):
        return costs
    ok = np.array([np.ones(costs.shape[-1], bool) if m is None else m for m in masks])
    return np.where(ok, costs, np.inf)


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
        self._prepare()

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

    def piece_keys(self, p: int, choice: np.ndarray) -> list[tuple[int, int | None, int | None]]:
        """Per piece of a block with port choice `p` and these node choices: where it starts (its carried
        node's choice, or p), p where it reads the port, and where it ends (its last node's choice): two
        pieces with equal keys can stand in for each other in any block."""
        return [(p if carried == PORT else int(choice[carried]), p if with_port else None,
                 None if last is None else int(choice[last])) for carried, _, last, with_port in self.pieces]

    def _prepare(self) -> None:
        """What the sweeps' costs are made of, per checkpoint flag (prices only weight it): per node its
        time and additive bytes as floats, and per edge its time (a checkpointed block recomputes too)."""
        sh = self.shape
        self._unary_parts = {
            ckpt: [(sh.time[v] + sh.recompute[v] if ckpt else sh.time[v],
                    (sh.state[v] + (0 if ckpt else sh.saved[v])).astype(float), sh.saved[v].astype(float))
                   for v in range(self.n)]
            for ckpt in (False, True)}
        self._edge_parts = {ckpt: [(s, d, cost + rec if ckpt else cost, sh.internal_work.get((s, d)))
                                   for s, d, cost, rec in self.internal] for ckpt in (False, True)}
        port = []
        for v in sorted(set(self.port) | set(sh.port_work)):
            cost, rec = self.port.get(v, (np.zeros((sh.port_size, sh.sizes[v])),) * 2)
            port.append((v, cost, rec, sh.port_work.get(v)))
        self._port_parts = {ckpt: [(v, cost + rec if ckpt else cost, work) for v, cost, rec, work in port]
                            for ckpt in (False, True)}
        self._masks: dict[tuple[str, ...], list[np.ndarray | None]] = {}

    def _mask(self, only: tuple[str, ...]) -> list[np.ndarray | None]:
        """Per node, the options `only` allows (None: all), once per `only`."""
        if only not in self._masks:
            sh = self.shape
            self._masks[only] = [allowed(sh.labels[v] if sh.labels else None, only) for v in range(self.n)]
        return self._masks[only]

    def _sweep_inputs(self, prices: list[Price], ckpt: bool, pins: list[Pin | None] | None = None) -> tuple[dict, dict]:
        """The sweep's unary and edge costs under each of `prices`, stacked on a leading axis; `pins`: per price,
        the block position it pins and the options left there (None: none)."""
        sh = self.shape
        a = np.array([p.a for p in prices])[:, None]
        b = np.array([p.b for p in prices])[:, None]
        c = np.array([p.c for p in prices])[:, None]
        caps = np.array([p.cap for p in prices])[:, None]
        capped = bool(np.isfinite(caps).any())
        masks = [self._mask(p.only) for p in prices]
        for i, pin in enumerate(pins or ()):
            if pin is not None:
                pos, keep = pin
                masks[i] = list(masks[i])
                masks[i][pos] = keep if masks[i][pos] is None else keep & masks[i][pos]
        unary = {}
        for v, (time, mem, saved) in enumerate(self._unary_parts[ckpt]):
            w = a * time + b * mem
            if ckpt:
                w = w + c * saved
            if capped:
                w = np.where(sh.transient[v] <= caps, w, np.inf)
            unary[v] = forbid(w, [m[v] for m in masks])
        a3, caps3 = a[:, :, None], caps[:, :, None]
        incoming: dict[int, list[tuple[int, np.ndarray]]] = {v: [] for v in range(self.n)}
        for s, d, cost, work in self._edge_parts[ckpt]:
            mat = a3 * cost
            incoming[d].append((s, mat if work is None or not capped else np.where(work <= caps3, mat, np.inf)))
        for v, cost, work in self._port_parts[ckpt]:
            mat = a3 * cost
            incoming[v].append((PORT, mat if work is None or not capped else np.where(work <= caps3, mat, np.inf)))
        return unary, incoming

    def _one(self, prices: list[Price], ckpt: bool, pins: list[Pin | None] | None) -> tuple[np.ndarray, list, list]:
        """The cheapest block per boundary (port choice, output choice) under each of `prices` (the leading
        axis), plain or checkpointed, and the pieces' sweeps and joins to read its choices back."""
        batch = len(prices)
        unary, incoming = self._sweep_inputs(prices, ckpt, pins)
        pieces, joins, total = [], [], None
        for carried, nodes, last, with_port in self.pieces:
            start = [carried] + ([PORT] if with_port else [])
            sweep = eliminate(nodes, self.sizes, unary, incoming, keep=start + ([last] if last is not None else []),
                              start=start, memo=self._memo, batch=batch)
            table = sweep.value if last is not None else sweep.value[..., None]
            pieces.append((carried, last, with_port, sweep))
            if total is None:  # (port, last)
                total = table
                continue
            # min-plus join through the cut node's choice: (port, cut) + (cut, last) or (cut, port, last), summed
            # as [port, last, cut]: the join's axis last, where argmin is fast
            step = np.transpose(table, (0, 2, 3, 1)) if with_port else np.swapaxes(table, 1, 2)[:, None, :, :]
            both = total[:, :, None, :] + np.ascontiguousarray(step)
            arg = np.argmin(both, axis=3)
            joins.append(arg)
            total = at_argmin(both, arg)
        if ckpt:
            b = np.array([p.b for p in prices])[:, None, None]
            total = total + b * self.shape.input_bytes.astype(float)[None, :, None]
        return total, pieces, joins

    def table(self, price: Price, checkpointing: bool) -> BlockTable:
        """The cheapest block per boundary under `price` (`tables` of one price)."""
        return self.tables([price], checkpointing)[0]

    def tables(self, prices: list[Price], checkpointing: bool, pins: list[Pin | None] | None = None) -> list[BlockTable]:
        """The cheapest block per boundary under each of `prices`, swept together (the same array operations
        on arrays with a leading axis of prices: one price's sweep is a few hundred small operations);
        `pins`: per price, a block position it pins (`Pin`, None: none)."""
        plain, pieces0, joins0 = self._one(prices, False, pins)
        if checkpointing:
            kept, pieces1, joins1 = self._one(prices, True, pins)
            cost, ckpt = np.minimum(plain, kept), kept < plain
        out = []
        for i in range(len(prices)):
            parts0 = ([(c, last, port, sw.at(i)) for c, last, port, sw in pieces0], [j[i] for j in joins0])
            if not checkpointing:
                out.append(BlockTable(plain[i], np.zeros(plain[i].shape, dtype=bool), (parts0, ([], []))))
                continue
            parts1 = ([(c, last, port, sw.at(i)) for c, last, port, sw in pieces1], [j[i] for j in joins1])
            out.append(BlockTable(cost[i], ckpt[i], (parts0, parts1)))
        return out

    def points(self, table: BlockTable, pairs: np.ndarray | None = None, both: bool = False) -> list[FrontierPoint]:
        """Frontier points (exact bytes and time) of the cheapest block of each finite (p, q) of `pairs`
        (all when None); with `both`, the cheapest plain and the cheapest checkpointed block each."""
        return self.make_points(*self.blocks(table, pairs, both))

    def blocks(self, table: BlockTable, pairs: np.ndarray | None = None, both: bool = False
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(p, q, checkpointed, node choices) of the cheapest block of each (p, q) of `pairs` (all finite ones
        when None), as `points` takes them: with `both`, all plain ones, then all checkpointed ones."""
        if pairs is None:
            pairs = np.argwhere(np.isfinite(table.cost))
        p, q = pairs[:, 0], pairs[:, 1]
        flags = [table.ckpt[p, q]] if not both else [np.zeros(len(p), bool)] + (
            [np.ones(len(p), bool)] if table.parts[1][0] else [])
        choice = [table.choice(p, q, ck, self.n) for ck in flags]
        return (np.tile(p, len(flags)), np.tile(q, len(flags)), np.concatenate(flags),
                np.concatenate(choice) if choice else np.zeros((0, self.n), dtype=np.int64))

    def make_points(self, p: np.ndarray, q: np.ndarray, ckpt: np.ndarray, choice: np.ndarray,
                    undominated: bool = False) -> list[FrontierPoint]:
        """The frontier points of these blocks (`blocks`), in order, those of finite time only; with
        `undominated`, only those `frontier.undominated` keeps, in its order (the others are never built)."""
        if len(p) == 0:
            return []
        add, top, time = self.measure(choice, p, ckpt)
        rows = np.flatnonzero(np.isfinite(time))
        if undominated:
            keys = np.column_stack([p[rows], q[rows], ckpt[rows]])
            rows = rows[undominated_rows(keys, np.column_stack([add[rows], top[rows], time[rows]]))]
        return [FrontierPoint(pp, qq, c, a_, t_, s_, tuple(ch))  # tolist(): plain ints and floats, fast
                for pp, qq, c, a_, t_, s_, ch in zip(p[rows].tolist(), q[rows].tolist(), ckpt[rows].tolist(),
                                                     add[rows].tolist(), top[rows].tolist(), time[rows].tolist(),
                                                     choice[rows].tolist())]

    def priced(self, price: Price, points: list[FrontierPoint]) -> np.ndarray:
        """The priced cost of each of these blocks under `price` (no cap or label restriction), as the sweeps
        price them (`_prepare`): a·time + b·additive bytes, + c·the activations a checkpointed block recomputes.
        A table's cost at (p, q) is the least of these over the blocks of that boundary."""
        choice = np.array([pt.choice for pt in points], dtype=np.int64)
        ckpt = np.array([pt.ckpt for pt in points])
        saved = sum(self.shape.saved[v][choice[:, v]].astype(float) for v in range(self.n))
        return (price.a * np.array([pt.time_s for pt in points])
                + price.b * np.array([pt.add_bytes for pt in points], dtype=float) + np.where(ckpt, price.c * saved, 0.0))

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
