"""Two-level solve for repeated blocks (DESIGN §6, "Identical blocks are the hard case").

Level 1: for one representative of each class of identical blocks, `block_frontier` lists the Pareto
frontier of (additive bytes, max-term bytes, time) per boundary (port choice p, output choice q) and
checkpoint flag. Level 2: an outer ILP over the non-block nodes (one-hot as in the flat ILP) and, per
segment of m chained blocks of one class, an integer count n_π in [0, m] per frontier point π:

* sum_π n_π = m; the points are arcs p -> q of a walk through the output node's choices that starts at
  the port's choice and ends at the last output's choice: per choice v,
  sum_{p(π)=v} n_π - sum_{q(π)=v} n_π = start[v] - end[v] (degree balance),
* the walk must be connected to its start: a flow of 1/m per arc end, sourced at the start choice and
  carried only by used arcs (f_a <= sum of n_π on arc a), so no detached cycle of arcs is counted,
* memory adds sum n_π·add_bytes(π); the max term gets T >= L·λ_L per distinct max_bytes value L, with a
  binary λ_L forced to 1 when any point with that value is used,
* time adds sum n_π·time_s(π).

An Eulerian trail of the chosen arcs orders the points along the segment, so each block gets its own point
(per-layer mixing is kept) and the result is exact: it equals the flat ILP's optimum. The outer ILP has no
symmetric copies of identical blocks, so it stays small and fast as the block count grows.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from planner.solve.decompose import Decomposition, decompose
from planner.solve.frontier import FrontierPoint, block_frontier
from planner.solve.ilp import ONE, BuiltModel, IlpBuilder, LinExpr
from planner.solve.indexed import IndexedProblem

__all__ = ["TwoLevel"]


def _trail(arcs: list[tuple[int, int, int]], start: int) -> list[int]:
    """Arc ids of an Eulerian trail from `start` using every arc (p, q, id) once (Hierholzer)."""
    adj: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for p, q, i in reversed(arcs):
        adj[p].append((q, i))
    stack: list[tuple[int, int | None]] = [(start, None)]
    path: list[int] = []
    while stack:
        v, arc = stack[-1]
        if adj[v]:
            stack.append(adj[v].pop())
        else:
            stack.pop()
            if arc is not None:
                path.append(arc)
    if len(path) != len(arcs):
        raise RuntimeError("the chosen block points do not form one walk (internal error)")
    return path[::-1]


class TwoLevel:
    """Frontiers per class (computed once per cap and reused) and the outer ILP built from them.

    `TwoLevel(ip)` raises NotDecomposable when the blocks do not have one port and one output each.
    """

    def __init__(self, ip: IndexedProblem) -> None:
        self.ip = ip
        self.dec: Decomposition = decompose(ip)
        self._cache: dict[tuple[int, float, bool], list[FrontierPoint]] = {}
        self._least = self._least_bytes()

    def _block_least(self, cls: int) -> float:
        shape = self.dec.classes[cls].shape
        state = sum(float(s.min()) for s in shape.state)
        saved = sum(float(s.min()) for s in shape.saved)
        return state + (min(saved, float(shape.input_bytes.min())) if self.ip.checkpointing else saved)

    def _least_bytes(self) -> float:
        """A lower bound on the additive memory of the whole problem (to cap frontiers)."""
        ip = self.ip
        outer = sum(float((ip.state[v] + ip.saved[v]).min()) for v in self.dec.outer_nodes)
        return outer + sum(self._block_least(self.dec.block_class[b]) for b in range(len(ip.block_nodes)))

    def frontier(self, cls: int, budget: int | None, with_time: bool) -> list[FrontierPoint]:
        """The class's frontier, without points that cannot fit `budget` (None: all points)."""
        cap = np.inf if budget is None else budget - (self._least - self._block_least(cls))
        key = (cls, cap, with_time)
        if key not in self._cache:
            self._cache[key] = block_frontier(self.dec.classes[cls].shape, checkpointing=self.ip.checkpointing,
                                              cap_bytes=cap, with_time=with_time)
        return self._cache[key]

    def frontier_sizes(self) -> list[int]:
        """Points per class in the most recently built time frontier (for reports)."""
        return [len(pts) for (cls, _, t), pts in self._cache.items() if t]

    def build(self, mode: str, budget: int | None) -> BuiltModel:
        """The outer ILP (see the module docstring) for `mode` "time" or "memory" under `budget`."""
        ip, dec = self.ip, self.dec
        b = IlpBuilder(ip)
        s = {v: b.one_hot(ip.sizes[v]) for v in dec.outer_nodes}
        for v in dec.outer_nodes:
            b.time.add(s[v], ip.time[v])
            b.memory.add(s[v], ip.state[v] + ip.saved[v])
            b.top(s[v], ip.transient[v].astype(float))
        ends = {seg.out: b.one_hot(ip.sizes[seg.out]) for seg in dec.segments if seg.out is not None}

        def ind(u: int | None) -> np.ndarray:
            return np.array([ONE]) if u is None else (s[u] if u in s else ends[u])

        for e in ip.edges:
            if ip.block_of[e.dst] < 0:
                b.pair_cost(ind(e.src), s[e.dst], e.cost, b.time)
        levels: dict[int, int] = {}
        counts = []
        for seg in dec.segments:
            pts = self.frontier(seg.cls, budget, with_time=mode == "time")
            counts.append(self._segment(b, seg.blocks, pts, ind(seg.port), ind(seg.out) if seg.out is not None
                                        else None, levels))
        model = b.finish(mode, budget)

        def extract(x: np.ndarray) -> tuple[list[int], list[int]]:
            choice = [0] * ip.n
            for v, vec in s.items():
                choice[v] = 0 if vec[0] == ONE else int(np.argmax(x[vec]))
            ckpt = []
            for seg, n in zip(dec.segments, counts):
                pts = self.frontier(seg.cls, budget, with_time=mode == "time")
                port = ind(seg.port)
                start = 0 if port[0] == ONE else int(np.argmax(x[port]))
                arcs = [(pts[i].p, pts[i].q, i) for i in range(len(pts)) for _ in range(int(round(x[n[i]])))]
                for blk, i in zip(seg.blocks, _trail(arcs, start)):
                    for v, c in zip(ip.block_nodes[blk], pts[i].choice):
                        choice[v] = c
                    if pts[i].ckpt:
                        ckpt.append(blk)
            return choice, sorted(ckpt)

        return BuiltModel(model, b.unit, extract)

    def _segment(self, b: IlpBuilder, blocks: list[int], pts: list[FrontierPoint], start: np.ndarray,
                 end: np.ndarray | None, levels: dict[int, int]) -> np.ndarray:
        """Count variables and rows of one segment; returns the count variables (one per point)."""
        m = len(blocks)
        n = b.model.add_vars(len(pts), lb=0.0, ub=float(m), integer=True)
        b.model.add_row(n, np.ones(len(pts)), m, m)
        if not pts:
            return n
        p = np.array([pt.p for pt in pts])
        q = np.array([pt.q for pt in pts])
        b.time.add(n, np.array([pt.time_s for pt in pts]))
        b.memory.add(n, np.array([pt.add_bytes for pt in pts], dtype=float))
        tops = np.array([pt.max_bytes for pt in pts])
        for level in np.unique(tops[tops > 0]):
            if int(level) not in levels:
                lam = int(b.model.add_vars(1, integer=True)[0])
                levels[int(level)] = lam
                expr = LinExpr()
                expr.add(np.array([lam]), float(level))
                b.tops.append((expr, float(level)))
            use = n[tops == level]
            b.model.add_row(np.concatenate([use, [levels[int(level)]]]),
                            np.concatenate([np.ones(len(use)), [-float(m)]]), hi=0.0)
        size = len(start)
        for v in range(size):
            row = LinExpr()
            row.add(n[p == v], 1.0)
            row.add(start[v:v + 1], -1.0)
            if m > 1:
                row.add(n[q == v], -1.0)
                row.add(end[v:v + 1], 1.0)
            b.add_expr_row(row, 0.0, 0.0)
        if m == 1 and end is not None:
            for v in range(len(end)):
                row = LinExpr()
                row.add(n[q == v], 1.0)
                row.add(end[v:v + 1], -1.0)
                b.add_expr_row(row, 0.0, 0.0)
        if m > 1 and size > 1:
            self._connect(b, n, p, q, start, m)
        return n

    @staticmethod
    def _connect(b: IlpBuilder, n: np.ndarray, p: np.ndarray, q: np.ndarray, start: np.ndarray, m: int) -> None:
        """Flow rows making every used arc's head reachable from the start choice over used arcs."""
        size = len(start)
        flow: dict[tuple[int, int], int] = {}
        for a, c in {(int(x), int(y)) for x, y in zip(p, q) if x != y}:
            f = int(b.model.add_vars(1)[0])
            flow[(a, c)] = f
            on_arc = n[(p == a) & (q == c)]
            b.model.add_row(np.concatenate([[f], on_arc]), np.concatenate([[1.0], -np.ones(len(on_arc))]), hi=0.0)
        supply = b.model.add_vars(size)
        for v in range(size):
            cap = LinExpr()
            cap.add(supply[v:v + 1], 1.0)
            cap.add(start[v:v + 1], -1.0)
            b.add_expr_row(cap, hi=0.0)
            bal = LinExpr()
            bal.add(np.array([f for (a, c), f in flow.items() if c == v], dtype=np.int64), 1.0)
            bal.add(np.array([f for (a, c), f in flow.items() if a == v], dtype=np.int64), -1.0)
            bal.add(n[q == v], -1.0 / m)
            bal.add(supply[v:v + 1], 1.0)
            b.add_expr_row(bal, 0.0, 0.0)
