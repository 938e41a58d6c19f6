"""Exact minimisation of a sum of unary and pairwise costs by variable elimination, with the argmin.

The costs are factors over one or two nodes' choices. Eliminating a node adds the factors that mention
it into one table over it and its neighbours and minimises it away, leaving a factor over the neighbours
(bucket elimination). Nodes go in the order that keeps that table smallest, so a transformer layer's
q, k and v, which only meet in the attention, are eliminated one at a time rather than held together.
Each elimination remembers where its minimum came from, so the winning choices can be read back for any
values of the nodes kept to the end.

    sweep = eliminate(nodes, sizes, unary, incoming, keep=[a, b])
    sweep.value                      # table over the kept nodes' choices (axes in `keep` order)
    choices = sweep.argmin({a: ia, b: ib})   # every other node's choice, for batches of kept values
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Sweep", "eliminate"]


@dataclass
class _Record:
    node: int  # the node minimised away
    scope: list[int]  # the nodes its minimum depends on
    arg: np.ndarray  # its minimising choice, a table over `scope`


@dataclass
class Sweep:
    """The result of `eliminate`: `value` is a table over the choices of `axes` (the kept nodes)."""

    value: np.ndarray
    axes: list[int]
    records: list[_Record]

    def argmin(self, given: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """The minimising choice of every eliminated node, for a batch of values of the kept nodes (`given`
        maps each node of `axes` to an index array; all arrays have the batch's length)."""
        vals = {k: np.asarray(v) for k, v in given.items()}
        batch = next(iter(vals.values())).shape if vals else ()
        for rec in reversed(self.records):
            idx = rec.arg[tuple(vals[u] for u in rec.scope)] if rec.scope else np.broadcast_to(rec.arg, batch)
            vals[rec.node] = np.asarray(idx)
        return vals


def _combine(factors: list[tuple[list[int], np.ndarray]], scope: list[int], sizes: dict[int, int]) -> np.ndarray:
    """The sum of `factors`, broadcast over `scope` (every factor's nodes are in scope)."""
    total = np.zeros(tuple(sizes[u] for u in scope))
    for nodes, arr in factors:
        perm = sorted(range(len(nodes)), key=lambda k: scope.index(nodes[k]))
        arr = np.transpose(arr, perm) if perm != list(range(len(nodes))) else arr
        shape = [1] * len(scope)
        for k in perm:
            shape[scope.index(nodes[k])] = sizes[nodes[k]]
        total = total + arr.reshape(shape)
    return total


def _schedule(order: list[int], sizes: dict[int, int], factors: list[list[int]],
              kept: list[int]) -> list[tuple[int, list[int]]]:
    """(node, scope) per elimination step: next the node whose table is smallest (ties: `order`)."""
    rank = {v: i for i, v in enumerate(order)}
    todo = [v for v in order if v not in kept]
    # near[v]: v and the nodes that share a factor with it (the scope of its elimination table), kept up
    # to date as nodes go instead of recomputed from every factor (which made the order quadratic)
    near: dict[int, set[int]] = {}
    for nodes in factors:
        for u in nodes:
            near.setdefault(u, set()).update(nodes)

    def table_size(x: int) -> tuple[float, int]:
        return float(math.prod(sizes[u] for u in near.get(x, {x}))), rank[x]

    steps = []
    while todo:
        x = min(todo, key=table_size)
        todo.remove(x)
        scope = sorted(near.get(x, {x}) - {x}, key=lambda u: (u not in kept, rank.get(u, -1), u))
        for u in scope:
            near[u] = (near[u] | set(scope)) - {x}
        near.pop(x, None)
        steps.append((x, scope))
    return steps


def eliminate(order: list[int], sizes: dict[int, int], unary: dict[int, np.ndarray],
              incoming: dict[int, list[tuple[int, np.ndarray]]], keep: list[int] | tuple[int, ...] = (),
              start: list[int] | tuple[int, ...] = (), memo: dict | None = None) -> Sweep:
    """Minimise sum_v unary[v][c_v] + sum over edges (u -> v) of M[c_u, c_v] over the nodes of `order`.

    order: the nodes to minimise over (their unary costs and incoming edges count); ties in the
        elimination order follow it.
    start: nodes outside `order` that edges may come from (a block's port); they count only through
        those edges.
    incoming[v]: (u, M) with M of shape (sizes[u], sizes[v]).
    keep: nodes (of `start` or `order`) not minimised away: the result is a table over them.
    memo: a dict that keeps the elimination order of each structure (nodes, edges, kept nodes, sizes)
        for the next call with the same structure and other costs (the price searches sweep one block
        many times); the order depends only on the structure, so the result is the same.
    Infinite costs forbid a choice.
    """
    factors: list[tuple[list[int], np.ndarray]] = []
    for v in order:
        factors.append(([v], np.asarray(unary[v], dtype=float)))
        for u, mat in incoming.get(v, ()):
            factors.append(([u, v], np.asarray(mat, dtype=float)))
    kept = list(keep)
    key = None
    if memo is not None:
        key = (tuple(order), tuple(kept), tuple(tuple(nodes) for nodes, _ in factors),
               tuple(sizes[u] for nodes, _ in factors for u in nodes))
    steps = memo.get(key) if memo is not None else None
    if steps is None:
        steps = _schedule(order, sizes, [nodes for nodes, _ in factors], kept)
        if memo is not None:
            memo[key] = steps
    records: list[_Record] = []
    for x, scope in steps:
        mine = [f for f in factors if x in f[0]]
        factors = [f for f in factors if x not in f[0]]
        table = _combine(mine, scope + [x], sizes)
        arg = np.argmin(table, axis=-1)
        records.append(_Record(x, scope, arg))
        factors.append((scope, np.take_along_axis(table, arg[..., None], axis=-1)[..., 0]))
    value = _combine(factors, kept, sizes) if kept else np.asarray(
        sum(float(arr) for _, arr in factors))
    return Sweep(value, kept, records)
