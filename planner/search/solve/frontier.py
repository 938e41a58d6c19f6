"""Pareto frontier of one block's internal assignments, per boundary, by dynamic programming.

A block seen from outside is: the choice p of its port (the node feeding it), the choice q of its output
node, whether it is checkpointed, and three numbers it adds to the formulas of `planner.search.solve.problem`:

* `add_bytes`: additive memory, sum of state (+ saved, or + input_bytes[p] when checkpointed),
* `max_bytes`: its candidate for the max term (largest transient, or the recomputed saved bytes),
* `time_s`: its nodes' times, the costs of edges into or inside it (+ recompute when checkpointed).

Everything outside only gets better when any of the three shrinks, so for each (p, q) only the
non-dominated points matter. The dynamic program sweeps the block's nodes in topological order; its
state is the choices of the nodes already swept that still have edges to unswept ones (and of the output
node), which handles DAG blocks such as a transformer layer with a residual edge. Each state keeps a
Pareto set of labels (add, saved, max transient, time) with the assignment that produced them. A step
is computed for all labels at once with numpy; an optional filter (the two-level solve's Lagrangian bound)
drops labels before the dominance check.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cost_models.errors import PlannerError

__all__ = [
    "BlockShape", "FrontierPoint", "FrontierTimeout", "FrontierTooLarge", "Prune", "SweepPlan", "block_frontier", "undominated",
    "undominated_rows",
    "group_pareto", "pareto_mask", "plan_sweep", "topological_order",
]

# Labels compared at once in the pairwise dominance check (memory ~ chunk x labels x columns).
_CHUNK = 256


class FrontierTooLarge(PlannerError, ValueError):
    """The block's dynamic program exceeds the label limit (too many cross edges or choices)."""


class FrontierTimeout(RuntimeError):
    """The block's dynamic program ran past its deadline."""


@dataclass
class BlockShape:
    """A block by position: per-node cost arrays, internal edges (src_pos, dst_pos, cost, recompute),
    edges from its port (dst_pos, cost[port choice, dst choice], recompute), the port's number of choices
    (1 when there is no port), the output node's position (None if nothing leaves the block) and the
    bytes kept when checkpointed, per port choice."""

    sizes: list[int]
    time: list[np.ndarray]
    recompute: list[np.ndarray]
    state: list[np.ndarray]
    saved: list[np.ndarray]
    transient: list[np.ndarray]
    internal: list[tuple[int, int, np.ndarray, np.ndarray]]
    from_port: list[tuple[int, np.ndarray, np.ndarray]]
    port_size: int
    out_pos: int | None
    input_bytes: np.ndarray
    # conversion working sets: (src_pos, dst_pos) -> bytes[src choice, dst choice]; dst_pos -> bytes[port
    # choice, dst choice] for edges from the port
    internal_work: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    port_work: dict[int, np.ndarray] = field(default_factory=dict)
    labels: list[np.ndarray | None] = field(default_factory=list)  # per position: a label per choice, or None


@dataclass(frozen=True)
class FrontierPoint:
    """One non-dominated way to run a block: boundary (p, q), checkpoint flag, its three numbers and the
    choice of each block node by position."""

    p: int
    q: int
    ckpt: bool
    add_bytes: int
    max_bytes: int
    time_s: float
    choice: tuple[int, ...]


def pareto_mask(values: np.ndarray) -> np.ndarray:
    """Boolean mask of the rows of `values` (k x d) not weakly dominated by another row: of equal rows one
    is kept. Smaller is better in every column. Rows are visited in lexicographic order, so a row can
    only be dominated by an earlier one; each chunk is compared with the rows kept so far and with
    itself, which costs k x (kept + chunk) comparisons rather than k^2."""
    k = len(values)
    keep = np.ones(k, dtype=bool)
    if k <= 1:
        return keep
    order = np.lexsort(values.T[::-1])
    w = values[order]
    sorted_keep = np.zeros(k, dtype=bool)
    kept = w[:0]
    for start in range(0, k, _CHUNK):
        block = w[start:start + _CHUNK]  # (c, d)
        inner = np.all(block[None, :, :] <= block[:, None, :], axis=2)  # [i, j]: row j <= row i
        dom = np.tril(inner, k=-1).any(axis=1)
        if len(kept):
            dom |= np.all(kept[None, :, :] <= block[:, None, :], axis=2).any(axis=1)
        sorted_keep[start:start + len(block)] = ~dom
        kept = np.concatenate([kept, block[~dom]])
    keep[order] = sorted_keep
    return keep


def topological_order(n: int, edges: list[tuple[int, int]]) -> list[int] | None:
    """Positions 0..n-1 in an order respecting edges (src before dst), lowest position first among
    ready ones; None when the edges have a cycle."""
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in edges:
        succ[s].append(d)
        indeg[d] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for d in succ[i]:
            indeg[d] -= 1
            if indeg[d] == 0:
                heapq.heappush(ready, d)
    return order if len(order) == n else None


@dataclass
class SweepPlan:
    """How a block is swept: node positions in topological order, the positions still needed after each
    step (`live[i]`, sorted: nodes with edges to later nodes, and the output node), each node's internal
    incoming edges (src_pos, cost, recompute) and the summed edges from the port (cost, recompute), both
    indexed [port choice, node choice]."""

    order: list[int]
    live: list[list[int]]
    incoming: list[list[tuple[int, np.ndarray, np.ndarray]]]
    port: list[tuple[np.ndarray, np.ndarray]]


def plan_sweep(shape: BlockShape) -> SweepPlan:
    """The sweep plan of `shape` (FrontierTooLarge if its edges have a cycle)."""
    n = len(shape.sizes)
    order = topological_order(n, [(s, d) for s, d, _, _ in shape.internal])
    if order is None:
        raise FrontierTooLarge("block edges form a cycle")
    step = {pos: i for i, pos in enumerate(order)}
    last_use = {pos: (step[pos] if pos != shape.out_pos else n) for pos in order}
    incoming: list[list[tuple[int, np.ndarray, np.ndarray]]] = [[] for _ in range(n)]
    for s, d, cost, rec in shape.internal:
        last_use[s] = max(last_use[s], step[d])
        incoming[d].append((s, cost, rec))
    port = [(np.zeros((shape.port_size, size)), np.zeros((shape.port_size, size))) for size in shape.sizes]
    for d, cost, rec in shape.from_port:
        port[d] = (port[d][0] + cost, port[d][1] + rec)
    live = [sorted(pos for pos in order[: i + 1] if last_use[pos] > i) for i in range(n)]
    return SweepPlan(order, live, incoming, port)


# prune(step, keys, labels) -> mask of labels to keep; keys (N x len(live[step])) are the live nodes' choices,
# labels (N x 4) rows (add, saved, largest working set or, checkpointed, recompute peak so far, time)
Prune = Callable[[int, np.ndarray, np.ndarray], np.ndarray]

_SHIFT_GROUP = 64  # groups up to this size are checked by shifted comparisons, larger ones one by one
_MAX_EXPANSION = 20_000_000  # labels x choices one sweep step may create


def group_pareto(codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Indices of the rows not weakly dominated by another row with the same code (of equal rows one is
    kept), all groups at once: rows sorted by (code, columns) can only be dominated by earlier rows of
    their group, compared by shifting the sorted array."""
    if len(codes) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(tuple(values[:, k] for k in range(values.shape[1] - 1, -1, -1)) + (codes,))
    c, w = codes[order], values[order]
    starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    sizes = np.diff(np.r_[starts, len(c)])
    dominated = np.zeros(len(c), dtype=bool)
    for d in range(1, min(int(sizes.max()), _SHIFT_GROUP)):
        dominated[d:] |= (c[d:] == c[:-d]) & np.all(w[:-d] <= w[d:], axis=1)
    for first, size in zip(starts[sizes > _SHIFT_GROUP], sizes[sizes > _SHIFT_GROUP]):
        dominated[first:first + size] = ~pareto_mask(w[first:first + size])
    return order[~dominated]


def _sweep(shape: BlockShape, plan: SweepPlan, p: int, ckpt: bool, with_time: bool, prune: Prune | None,
           max_labels: int, deadline: float = np.inf) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Pareto DP for port choice p, vectorised over all labels of a step. Returns the final labels'
    keys (N x 1: output choice, or N x 0), labels (N x 4: additive bytes (state, + saved unless
    checkpointed), saved bytes (checkpointed only), largest working set (checkpointed: the recompute
    peak, which needs the sweep in the block's order), time) and assignments (N x n, in sweep order)."""
    if ckpt and plan.order != sorted(plan.order):
        raise FrontierTooLarge("a checkpointed block's recompute peak needs its nodes listed in forward order")
    prev: list[int] = []
    keys = np.zeros((1, 0), dtype=np.int64)
    vals = np.zeros((1, 4))
    asg = np.zeros((1, 0), dtype=np.int16)
    for i, v in enumerate(plan.order):
        if time.perf_counter() > deadline:
            raise FrontierTimeout("block frontier ran past the time limit")
        size, live = shape.sizes[v], plan.live[i]
        if len(vals) * size > _MAX_EXPANSION:
            raise FrontierTooLarge(f"block frontier would expand {len(vals)} labels by {size} choices at node {i}")
        rep = np.repeat(np.arange(len(vals)), size)
        cs = np.tile(np.arange(size), len(vals))
        step_t = shape.time[v] + plan.port[v][0][p] + ((shape.recompute[v] + plan.port[v][1][p]) if ckpt else 0.0)
        dt = step_t[cs]
        work = np.zeros(len(cs))
        for s, cost, rec in plan.incoming[v]:
            src = keys[rep, prev.index(s)]
            dt = dt + (cost + rec if ckpt else cost)[src, cs]
            if (s, v) in shape.internal_work:
                work = np.maximum(work, shape.internal_work[(s, v)][src, cs])
        if v in shape.port_work:
            work = np.maximum(work, shape.port_work[v][p, cs])
        new = vals[rep]
        new[:, 0] += (shape.state[v] + (0 if ckpt else shape.saved[v]))[cs]
        work = np.maximum(shape.transient[v][cs], work)
        if ckpt:  # the recompute peak so far: what is recomputed up to v beside v's working set
            new[:, 1] += shape.saved[v][cs]
            new[:, 2] = np.maximum(new[:, 2], new[:, 1] + work)
        else:
            new[:, 2] = np.maximum(new[:, 2], work)
        if with_time:
            new[:, 3] += dt
        cols = [cs if u == v else keys[rep, prev.index(u)] for u in live]
        new_keys = np.stack(cols, axis=1) if cols else np.zeros((len(new), 0), dtype=np.int64)
        new_asg = np.hstack([asg[rep], cs[:, None].astype(np.int16)])
        if prune is not None:  # cheap, linear: before the dominance check
            alive = prune(i, new_keys, new)
            new_keys, new, new_asg = new_keys[alive], new[alive], new_asg[alive]
        codes = (np.ravel_multi_index(tuple(new_keys.T), [shape.sizes[u] for u in live]) if live
                 else np.zeros(len(new), dtype=np.int64))
        keep = group_pareto(codes, new)
        keys, vals, asg = new_keys[keep], new[keep], new_asg[keep]
        if len(vals) > max_labels:
            raise FrontierTooLarge(f"block frontier needs more than {max_labels} labels at node {i}")
        prev = live
    return keys, vals, asg


def block_frontier(shape: BlockShape, *, checkpointing: bool, with_time: bool = True,
                   prune: Callable[[int, bool], Prune | None] | None = None,
                   max_labels: int = 2_000_000, deadline: float = np.inf) -> list[FrontierPoint]:
    """All non-dominated (add_bytes, max_bytes, time_s) points per boundary (p, q) and checkpoint flag.

    With `with_time=False` time is ignored (all zero): the memory-only frontier, for minimising peak
    memory. `prune(p, ckpt)` may give a label filter for that sweep (labels it rejects, and every label
    they would lead to, are dropped: it must only reject labels that cannot be part of a wanted answer).
    Raises FrontierTooLarge past `max_labels` labels in one sweep step, FrontierTimeout past `deadline`
    (a time.perf_counter() value).
    """
    plan = plan_sweep(shape)
    inverse = np.argsort(plan.order)
    points: list[FrontierPoint] = []
    for p in range(shape.port_size):
        rows: list[np.ndarray] = []
        meta: list[tuple[int, bool, tuple[int, ...]]] = []
        for ckpt in ([False, True] if checkpointing else [False]):
            hook = prune(p, ckpt) if prune is not None else None
            keys, vals, asg = _sweep(shape, plan, p, ckpt, with_time, hook, max_labels, deadline)
            q = keys[:, 0] if keys.shape[1] else np.zeros(len(vals), dtype=np.int64)
            add = vals[:, 0] + (float(shape.input_bytes[p]) if ckpt else 0.0)
            top = vals[:, 2]  # the largest working set, or a checkpointed block's recompute peak (problem.py)
            rows.append(np.stack([q, add, top, vals[:, 3]], axis=1))
            meta += [(int(qq), ckpt, tuple(int(x) for x in a[inverse])) for qq, a in zip(q, asg)]
        if not rows:
            continue
        table = np.vstack(rows)
        for q in np.unique(table[:, 0]):
            idx = np.nonzero(table[:, 0] == q)[0]
            for j in idx[pareto_mask(table[idx, 1:])]:
                q_, ckpt, choice = meta[j]
                points.append(FrontierPoint(p, q_, ckpt, int(round(table[j, 1])), int(round(table[j, 2])),
                                            float(table[j, 3]), choice))
    return points


def undominated(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """The points no other point of the same boundary and checkpoint flag beats in additive bytes, max-term
    bytes and time at once: the outer ILP never needs a dominated one, and fewer columns solve faster."""
    if not points:
        return []
    cols = np.array([(pt.p, pt.q, pt.ckpt, pt.add_bytes, pt.max_bytes, pt.time_s) for pt in points], dtype=float)
    return [points[i] for i in undominated_rows(cols[:, :3].astype(np.int64), cols[:, 3:]).tolist()]


def undominated_rows(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`undominated` on arrays: the indices of the rows of `values` (k x 3: additive bytes, max-term bytes,
    time) that no row with the same `keys` row (boundary p, q and checkpoint flag) weakly dominates (of equal
    rows the first), groups in the order their keys first appear, each in row order; so callers build points
    for the survivors only (a priced search's column sets: 50,000 blocks, a third undominated)."""
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64)
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    _, first, group = np.unique(keys.view(np.dtype((np.void, keys.itemsize * keys.shape[1]))).ravel(),
                                return_index=True, return_inverse=True)
    seen = np.argsort(first, kind="stable")  # the groups in the order first seen
    rank = np.empty(len(first), dtype=np.int64)
    rank[seen] = np.arange(len(first))
    order = np.argsort(rank[group.ravel()], kind="stable")  # by group in first-seen order, rows in order
    sizes = np.bincount(group.ravel(), minlength=len(first))[seen]
    keep = np.ones(len(order), dtype=bool)
    start = 0
    values = np.asarray(values, dtype=float)
    for size in sizes.tolist():
        if size > 1:
            rows = order[start:start + size]
            keep[start:start + size] = pareto_mask(values[rows])
        start += size
    return order[keep]
