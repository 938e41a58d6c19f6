"""Exact minimisation of a sum of unary and pairwise costs by variable elimination, with the argmin.

The problems here are chains of ops with a few long-lived tensors (a residual stream): swept in
topological order, only the choices of nodes that still have edges to unswept nodes need to be held, so
a dense table over those few nodes' choices is enough. Each step adds one node's axis and its costs,
then minimises away the nodes no later step needs, remembering where each minimum came from so the
winning choices can be read back for any values of the nodes kept to the end.

    sweep = eliminate(order, sizes, unary, incoming, keep=[a, b])
    sweep.value                      # table over the kept nodes' choices (axes in `keep` order)
    choices = sweep.argmin({a: ia, b: ib})   # every swept node's choice, for batches of kept values
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Sweep", "eliminate"]


@dataclass
class _Record:
    kept: list[int]  # nodes whose axes remain after the step, in table order
    dropped: list[int]
    shape: tuple[int, ...]  # sizes of the dropped nodes
    arg: np.ndarray  # flat argmin over the dropped axes, a table over `kept`


@dataclass
class Sweep:
    """The result of `eliminate`: `value` is a table over the choices of `axes` (the kept nodes)."""

    value: np.ndarray
    axes: list[int]
    records: list[_Record]

    def argmin(self, given: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """The minimising choice of every swept node, for a batch of values of the kept nodes (`given`
        maps each node of `axes` to an index array; all arrays have the batch's length)."""
        vals = dict(given)
        for rec in reversed(self.records):
            flat = rec.arg[tuple(vals[a] for a in rec.kept)] if rec.kept else np.broadcast_to(
                rec.arg, next(iter(vals.values())).shape if vals else ())
            for node, idx in zip(rec.dropped, np.unravel_index(flat, rec.shape)):
                vals[node] = np.asarray(idx)
        return vals


def eliminate(order: list[int], sizes: dict[int, int], unary: dict[int, np.ndarray],
              incoming: dict[int, list[tuple[int, np.ndarray]]], keep: list[int] | tuple[int, ...] = (),
              start: list[int] | tuple[int, ...] = ()) -> Sweep:
    """Minimise sum_v unary[v][c_v] + sum over edges (u -> v) of M[c_u, c_v] over the nodes of `order`.

    order: nodes in an order where every edge's source comes before its destination, except sources in
        `start` (nodes not swept here, whose axes exist from the beginning: a block's port).
    incoming[v]: (u, M) with M of shape (sizes[u], sizes[v]).
    keep: nodes (of `start` or `order`) not minimised away: the result is a table over them.
    Infinite costs forbid a choice.
    """
    step_of = {v: i for i, v in enumerate(order)}
    last = {v: i for i, v in enumerate(order)}
    for v in order:
        for u, _ in incoming.get(v, ()):
            last[u] = max(last.get(u, -1), step_of[v])
    for u in list(keep) + list(start):
        last[u] = len(order)
    table = np.zeros(tuple(sizes[u] for u in start))
    axes = list(start)
    records: list[_Record] = []
    for i, v in enumerate(order):
        nd = len(axes) + 1
        table = table[..., None] + unary[v].reshape((1,) * (nd - 1) + (-1,))
        for u, mat in incoming.get(v, ()):
            shape = [1] * nd
            shape[axes.index(u)] = mat.shape[0]
            shape[-1] = mat.shape[1]
            table = table + mat.reshape(shape)
        axes = axes + [v]
        dropped = [u for u in axes if last[u] <= i]
        if dropped:
            kept = [u for u in axes if last[u] > i]
            perm = [axes.index(u) for u in kept] + [axes.index(u) for u in dropped]
            moved = np.transpose(table, perm)
            dshape = moved.shape[len(kept):]
            flat = moved.reshape(moved.shape[:len(kept)] + (-1,))
            arg = np.argmin(flat, axis=-1)
            table = np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
            records.append(_Record(kept, dropped, tuple(int(s) for s in dshape), arg))
            axes = kept
    perm = [axes.index(u) for u in keep]
    return Sweep(np.transpose(table, perm) if perm else table, list(keep), records)
