"""One price's exact minimum over every assignment of a decomposable problem (`columns.PricedSolve`'s sweep).

Under a price (a per second, b per additive byte, c per recomputed byte; transient caps and label
restrictions as masks), the priced sum separates: per block class a table of the cheapest block for every
boundary (`planner.search.solve.block_dp`), per segment of m chained blocks its min-plus m-th power, and
one variable-elimination sweep over the nodes outside blocks (`planner.search.solve.eliminate`). The
argmins walk back to the minimiser: one choice per node and the checkpointed blocks.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner.search.solve.block_dp import BlockDP, BlockTable, Pin, Price, allowed, forbid
from planner.search.solve.decompose import Decomposition
from planner.search.solve.eliminate import at_argmin, eliminate
from planner.search.solve.frontier import topological_order
from planner.search.solve.indexed import IndexedProblem

__all__ = ["PriceSweep"]


class PriceSweep:
    """The exact minimum of the priced sum and its minimiser, for one problem and its decomposition."""

    def __init__(self, ip: IndexedProblem, dec: Decomposition) -> None:
        self.ip, self.dec = ip, dec
        self.dps = [BlockDP(c.shape) for c in dec.classes]
        self._memo: dict = {}  # compiled eliminations of the outer sweep (see eliminate's memo)
        self._edges = [e for e in ip.edges if ip.block_of[e.dst] < 0]  # the edges into outer nodes
        self._order: list[int] | None = None  # the outer sweep's node order (the same under every price)
        self._masks: dict[tuple[str, ...], dict[int, np.ndarray | None]] = {}  # `_mask` per `only`
        # block node -> (class, position): a pin on it pins that position in its class's table
        self._where = {v: (dec.block_class[blk], pos) for blk, nodes in enumerate(ip.block_nodes)
                       for pos, v in enumerate(nodes)}

    def _mask(self, only: tuple[str, ...]) -> dict[int, np.ndarray | None]:
        """Per outer node, the options `only` allows (None: all), once per `only`."""
        if only not in self._masks:
            self._masks[only] = {v: allowed(self.ip.labels[v], only) for v in self.dec.outer_nodes}
        return self._masks[only]

    def _pin_mask(self, price: Price, v: int) -> np.ndarray | None:
        """The options `price` leaves outer node v: its `only` and its `pin` together (None: all)."""
        mask = self._mask(price.only)[v]
        if price.pin is None or price.pin[0] != v:
            return mask
        keep = self._kept(*price.pin)
        return keep if mask is None else keep & mask

    def _kept(self, v: int, options: tuple[int, ...]) -> np.ndarray:
        """Node v's options as a mask: True at `options` (a price's `pin`)."""
        keep = np.zeros(self.ip.sizes[v], bool)
        keep[list(options)] = True
        return keep

    def _class_pins(self, prices: list[Price], cls: int) -> list[Pin | None] | None:
        """Per price, the position of class `cls` it pins and the options left there (None: no price pins one)."""
        pins: list[Pin | None] = []
        for p in prices:
            where = self._where.get(p.pin[0]) if p.pin is not None else None
            if where is None or where[0] != cls:
                pins.append(None)
                continue
            pins.append((where[1], self._kept(*p.pin)))
        return pins if any(x is not None for x in pins) else None

    def tables(self, price: Price) -> list[BlockTable]:
        """Per block class, the cheapest block under `price` for every boundary."""
        return self.tables_many([price])[0]

    def tables_many(self, prices: list[Price], known: dict[Price, list[BlockTable]] | None = None
                    ) -> list[list[BlockTable]]:
        """`tables` of each of `prices`, every class swept under all of them at once. A class that a price's
        pin does not touch has the table of that price without its pin: from `known` (tables swept before, by
        price) or swept once for all such prices (pinned prices differ from each other only there:
        `planner.search.solve.pinned`)."""
        known = known or {}
        per_class = []
        for k, dp in enumerate(self.dps):
            pins = self._class_pins(prices, k) or [None] * len(prices)
            todo: list[Price] = []  # a price that pins this class as it is; the others without their pin, once each
            todo_pins: list[Pin | None] = []
            seen: dict[Price, int] = {}
            slot = []
            for p, pin in zip(prices, pins):
                if pin is None:
                    key = replace(p, pin=None) if p.pin is not None else p
                    if key not in seen:
                        seen[key] = len(todo)
                        todo.append(key)
                        todo_pins.append(None)
                    slot.append(seen[key])
                else:
                    slot.append(len(todo))
                    todo.append(p)
                    todo_pins.append(pin)
            fresh = [i for i, (p, pin) in enumerate(zip(todo, todo_pins)) if pin is not None or p not in known]
            swept = dp.tables([todo[i] for i in fresh], self.ip.checkpointing,
                              [todo_pins[i] for i in fresh] if any(todo_pins[i] is not None for i in fresh) else None
                              ) if fresh else []
            done = dict(zip(fresh, swept))
            per_class.append([done[i] if i in done else known[todo[i]][k] for i in slot])
        return [[tables[i] for tables in per_class] for i in range(len(prices))]

    def minimum(self, price: Price) -> float:
        """The least priced sum under `price` alone (what the bounds are built from), without the
        minimiser's choices or its exact time and peak."""
        return float(self.sweep([price], [self.tables(price)])[0].value[0])

    def sweep(self, prices: list[Price], tables: list[list[BlockTable]]) -> tuple:
        """The outer variable-elimination sweep under each of `prices` (a leading axis on every array), the
        blocks' tables given per price, and per segment its min-plus powers with their argmins (to walk the
        blocks' boundaries back)."""
        ip, dec = self.ip, self.dec
        batch = len(prices)
        a, b = (np.array([getattr(p, k) for p in prices])[:, None] for k in "ab")
        caps = np.array([p.cap for p in prices])[:, None]
        capped = bool(np.isfinite(caps).any())
        sizes: dict[int, int] = {}
        unary: dict[int, np.ndarray] = {}
        incoming: dict[int, list[tuple[int, np.ndarray]]] = {}
        for v in dec.outer_nodes:
            w = a * ip.time[v] + b * (ip.state[v] + ip.saved[v]).astype(float)
            if capped:
                w = np.where(ip.transient[v] <= caps, w, np.inf)
            sizes[v], unary[v], incoming[v] = ip.sizes[v], forbid(w, [self._pin_mask(p, v) for p in prices]), []
        powers = []
        for k, seg in enumerate(dec.segments):
            cost = np.stack([t[seg.cls].cost for t in tables])
            into = np.ascontiguousarray(np.swapaxes(cost, 1, 2))  # [q, x]: the join's axis last, where argmin is fast
            steps = [(cost, None)]
            for _ in range(len(seg.blocks) - 1):  # min-plus powers, with the argmin of each join
                both = steps[-1][0][:, :, None, :] + into[:, None, :, :]  # [p, q, x]
                arg = np.argmin(both, axis=3)
                steps.append((at_argmin(both, arg), arg))
            powers.append(steps)
            node = _seg_node(k, seg.out)
            sizes[node] = cost.shape[2]
            if seg.port is None:
                unary[node], incoming[node] = steps[-1][0][:, 0], []
            else:
                unary[node], incoming[node] = np.zeros((batch, cost.shape[2])), [(seg.port, steps[-1][0])]
        a3, b3, caps3 = a[:, :, None], b[:, :, None], caps[:, :, None]
        for e in self._edges:
            mat = a3 * e.cost + (0.0 if e.saved is None else b3 * e.saved.astype(float))
            if e.transient is not None and capped:
                mat = np.where(e.transient <= caps3, mat, np.inf)
            incoming[e.dst].append((e.src, mat))
        if self._order is None:
            ids = list(sizes)
            pos = {v: i for i, v in enumerate(ids)}
            order = topological_order(len(ids), [(pos[u], pos[v]) for v in ids for u, _ in incoming[v]])
            if order is None:
                raise RuntimeError("outer nodes form a cycle (internal error)")
            self._order = [ids[i] for i in order]
        sweep = eliminate(self._order, sizes, unary, incoming, memo=self._memo, batch=batch)
        return sweep, powers

    def minimiser(self, price: Price, tables: list[BlockTable]) -> tuple[list[int], list[int], list, float]:
        """The minimiser under `price` (the blocks' `tables` given): see `minimisers`."""
        return self.minimisers([price], [tables])[0]

    def minimisers(self, prices: list[Price], tables: list[list[BlockTable]]
                   ) -> list[tuple[list[int], list[int], list, float]]:
        """The minimiser under each of `prices` (the blocks' `tables` given per price), swept together: one
        choice per node, the checkpointed blocks (sorted), per block its (class, p, q, checkpointed)
        boundary, and the minimum."""
        ip, dec = self.ip, self.dec
        batch, powers = self.sweep(prices, tables)
        out = []
        for i in range(len(prices)):
            sweep = batch.at(i)
            picked = {v: int(x) for v, x in sweep.argmin({}).items()}
            choice = [0] * ip.n
            for v in dec.outer_nodes:
                choice[v] = picked[v]
            ckpt, boundary = [], []
            for k, seg in enumerate(dec.segments):
                start = 0 if seg.port is None else picked[seg.port]
                walk = [picked[_seg_node(k, seg.out)]]
                for _, arg in reversed(powers[k][1:]):
                    walk.append(int(arg[i, start, walk[-1]]))
                walk.append(start)
                walk = walk[::-1]  # walk[i] -> walk[i + 1] is block i's boundary
                table, dp = tables[i][seg.cls], self.dps[seg.cls]
                ps, qs = np.array(walk[:-1]), np.array(walk[1:])
                flags = table.ckpt[ps, qs]
                rows = table.choice(ps, qs, flags, dp.n)
                for blk, row, p, q, flag in zip(seg.blocks, rows, ps, qs, flags):
                    for v, c in zip(ip.block_nodes[blk], row):
                        choice[v] = int(c)
                    if flag:
                        ckpt.append(blk)
                    boundary.append((seg.cls, int(p), int(q), bool(flag)))
            out.append((choice, sorted(ckpt), boundary, float(sweep.value)))
        return out


def _seg_node(k: int, out: int | None) -> int:
    """The outer sweep's node for segment k: its output node, or a fresh id when nothing leaves it."""
    return out if out is not None else -(k + 2)
