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

With `batch=B` every cost array has a leading axis of B costs of the same structure (the price searches
sweep one block under several prices at once: the array operations are the same few, on bigger arrays),
and `sweep.at(i)` is the sweep of the i-th.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Sweep", "at_argmin", "eliminate"]


@dataclass
class _Record:
    node: int  # the node minimised away
    scope: list[int]  # the nodes its minimum depends on
    arg: np.ndarray  # its minimising choice, a table over `scope`


@dataclass
class Sweep:
    """The result of `eliminate`: `value` is a table over the choices of `axes` (the kept nodes). Of a
    batched elimination (`index` None, every array with the batch axis first) only `at` reads choices back."""

    value: np.ndarray
    axes: list[int]
    records: list[_Record]
    index: int | None = None  # which cost of a batched elimination this sweep is (`at`)

    def at(self, i: int) -> Sweep:
        """The sweep of the i-th cost of a batched elimination."""
        return Sweep(self.value[i], self.axes, self.records, i)

    def argmin(self, given: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """The minimising choice of every eliminated node, for a batch of values of the kept nodes (`given`
        maps each node of `axes` to an index array; all arrays have the batch's length)."""
        vals = {k: np.asarray(v) for k, v in given.items()}
        batch = next(iter(vals.values())).shape if vals else ()
        for rec in reversed(self.records):
            arg = rec.arg if self.index is None else rec.arg[self.index]
            idx = arg[tuple(vals[u] for u in rec.scope)] if rec.scope else np.broadcast_to(arg, batch)
            vals[rec.node] = np.asarray(idx)
        return vals


def at_argmin(table: np.ndarray, arg: np.ndarray) -> np.ndarray:
    """`table`'s values at `arg`, its argmin along the last axis (`np.take_along_axis` without its index
    broadcasting: flat indices into the C-ordered table, a third of the time on the sweeps' small tables)."""
    flat = np.ascontiguousarray(table).reshape(-1)
    return flat[np.arange(arg.size) * table.shape[-1] + arg.reshape(-1)].reshape(arg.shape)


@dataclass
class _Term:
    """How one factor enters a table: its array's axes permuted into the table's order (None: as it is),
    then reshaped to broadcast over the table's axes."""

    factor: int  # index into the sweep's factor list (the initial factors, then one per elimination)
    perm: tuple[int, ...] | None
    shape: tuple[int, ...]


def _terms(factor_ids: list[int], factor_nodes: list[list[int]], scope: list[int],
           sizes: dict[int, int]) -> list[_Term]:
    """The terms that sum `factor_ids` into a table over `scope` (every factor's nodes are in scope)."""
    terms = []
    for f in factor_ids:
        nodes = factor_nodes[f]
        perm = sorted(range(len(nodes)), key=lambda k: scope.index(nodes[k]))
        shape = [1] * len(scope)
        for k in perm:
            shape[scope.index(nodes[k])] = sizes[nodes[k]]
        terms.append(_Term(f, tuple(perm) if perm != list(range(len(nodes))) else None, tuple(shape)))
    return terms


def _sum_terms(terms: list[_Term], arrays: list[np.ndarray], shape: tuple[int, ...], lead: tuple[int, ...] = ()
               ) -> np.ndarray:
    """The terms summed into one C-ordered table of `lead + shape`, left to right (a fresh array once two
    terms are added, then added to in place: the sweeps call this a hundred thousand times on small tables).
    `lead`: the batch axis every array has first, or ()."""
    total: np.ndarray | None = None
    owned = False
    full = lead + shape
    k = len(lead)
    for t in terms:
        arr = arrays[t.factor]
        if t.perm is not None:
            arr = np.transpose(arr, tuple(range(k)) + tuple(p + k for p in t.perm))
        view = arr.reshape(lead + t.shape)
        if total is None:
            total = view
        elif owned and total.shape == full:
            total += view
        else:
            total, owned = np.add(total, view, order="C"), True  # C order: argmin runs along the last axis
    if total is None:
        return np.zeros(full)
    if not owned or total.shape != full:
        total = np.add(total, np.zeros(full), order="C")
    return total


@dataclass
class _Program:
    """An elimination compiled for one structure (nodes, factors, kept nodes, sizes): per step the node
    minimised away, its scope, the factors summed into its table and that table's shape; then the terms of
    the final table over the kept nodes. The price searches sweep one structure with many costs, so this
    is built once per structure and replayed with plain array operations."""

    steps: list[tuple[int, list[int], list[_Term], tuple[int, ...]]]
    final: list[_Term]
    final_shape: tuple[int, ...]


def _compile(order: list[int], sizes: dict[int, int], factor_nodes: list[list[int]], kept: list[int]) -> _Program:
    nodes_of = list(factor_nodes)
    alive = list(range(len(nodes_of)))
    steps = []
    for x, scope in _schedule(order, sizes, factor_nodes, kept):
        mine = [f for f in alive if x in nodes_of[f]]
        alive = [f for f in alive if x not in nodes_of[f]]
        axes = scope + [x]
        steps.append((x, scope, _terms(mine, nodes_of, axes, sizes), tuple(sizes[u] for u in axes)))
        alive.append(len(nodes_of))
        nodes_of.append(scope)
    final = _terms(alive, nodes_of, kept, sizes) if kept else [_Term(f, None, ()) for f in alive]
    return _Program(steps, final, tuple(sizes[u] for u in kept))


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


def _factors(order: list[int], unary: dict[int, np.ndarray], incoming: dict[int, list[tuple[int, np.ndarray]]]
             ) -> tuple[list[list[int]], list[np.ndarray]]:
    """The factors of a sweep: each node's unary cost, then its incoming edges' matrices (nodes, array)."""
    factor_nodes: list[list[int]] = []
    arrays: list[np.ndarray] = []
    for v in order:
        factor_nodes.append([v])
        arrays.append(np.asarray(unary[v], dtype=float))
        for u, mat in incoming.get(v, ()):
            factor_nodes.append([u, v])
            arrays.append(np.asarray(mat, dtype=float))
    return factor_nodes, arrays


def _program(order: list[int], sizes: dict[int, int], factor_nodes: list[list[int]], kept: list[int],
             memo: dict | None) -> _Program:
    """The compiled elimination of this structure, from `memo` where it was compiled before."""
    key = None
    if memo is not None:
        key = (tuple(order), tuple(kept), tuple(tuple(nodes) for nodes in factor_nodes),
               tuple(sizes[u] for nodes in factor_nodes for u in nodes))
    program = memo.get(key) if memo is not None else None
    if program is None:
        program = _compile(order, sizes, factor_nodes, kept)
        if memo is not None:
            memo[key] = program
    return program


def eliminate(order: list[int], sizes: dict[int, int], unary: dict[int, np.ndarray],
              incoming: dict[int, list[tuple[int, np.ndarray]]], keep: list[int] | tuple[int, ...] = (),
              start: list[int] | tuple[int, ...] = (), memo: dict | None = None, batch: int = 0) -> Sweep:
    """Minimise sum_v unary[v][c_v] + sum over edges (u -> v) of M[c_u, c_v] over the nodes of `order`.

    order: the nodes to minimise over (their unary costs and incoming edges count); ties in the
        elimination order follow it.
    start: nodes outside `order` that edges may come from (a block's port); they count only through
        those edges.
    incoming[v]: (u, M) with M of shape (sizes[u], sizes[v]).
    keep: nodes (of `start` or `order`) not minimised away: the result is a table over them.
    memo: a dict that keeps the compiled elimination of each structure (nodes, edges, kept nodes, sizes)
        for the next call with the same structure and other costs (the price searches sweep one block
        many times); the order depends only on the structure, so the result is the same.
    batch: B > 0 when every cost array has a leading axis of B costs (the result's arrays have it too;
        `Sweep.at(i)` reads the i-th's choices back).
    Infinite costs forbid a choice.
    """
    factor_nodes, arrays = _factors(order, unary, incoming)
    kept = list(keep)
    program = _program(order, sizes, factor_nodes, kept, memo)
    lead = (batch,) if batch else ()
    records: list[_Record] = []
    for x, scope, terms, shape in program.steps:
        table = _sum_terms(terms, arrays, shape, lead)
        arg = np.argmin(table, axis=-1)
        records.append(_Record(x, scope, arg))
        arrays.append(at_argmin(table, arg))
    if kept:
        value = _sum_terms(program.final, arrays, program.final_shape, lead)
    elif batch:
        value = np.zeros(batch)
        for t in program.final:  # left to right, as the sum of floats below
            value = value + arrays[t.factor]
    else:
        value = np.asarray(sum(float(arrays[t.factor]) for t in program.final))
    return Sweep(value, kept, records)


def _reduce_to(table: np.ndarray, axes: list[int], onto: list[int], lead: int) -> np.ndarray:
    """`table` (axes: `lead` batch axes, then one per node of `axes`) minimised over every node not in `onto`,
    its axes in `onto`'s order."""
    drop = tuple(lead + a for a, u in enumerate(axes) if u not in onto)
    out = table.min(axis=drop) if drop else table
    left = [u for u in axes if u in onto]
    perm = [left.index(u) for u in onto]
    return out if perm == sorted(perm) else np.transpose(out, tuple(range(lead)) + tuple(lead + p for p in perm))


def min_marginals(order: list[int], sizes: dict[int, int], unary: dict[int, np.ndarray],
                  incoming: dict[int, list[tuple[int, np.ndarray]]], memo: dict | None = None, batch: int = 0
                  ) -> tuple[dict[int, np.ndarray], dict[tuple[int, int], np.ndarray]]:
    """Every node's min-marginal (over its choices: the least sum with the node at that choice, what
    `eliminate(keep=[v]).value` gives) and every edge's (u, v) (over both nodes' choices), from one elimination
    and one pass back down its tree of tables: each table, plus what everything outside its subtree adds at
    best (the "outside" message, from the parent's table without this child's message), holds the exact
    min-marginal of its nodes. Arguments as `eliminate` (no kept nodes); the values equal its up to the order
    in which floats are added."""
    factor_nodes, arrays = _factors(order, unary, incoming)
    program = _program(order, sizes, factor_nodes, [], memo)
    lead = (batch,) if batch else ()
    k = len(lead)
    first = len(arrays)  # factor id of step i's message: first + i
    tables = []
    for _, _, terms, shape in program.steps:
        tables.append(_sum_terms(terms, arrays, shape, lead))
        arrays.append(tables[-1].min(axis=-1))
    outside: list[np.ndarray | None] = [None] * len(program.steps)
    roots = [t.factor for t in program.final]
    for f in roots:  # a message nothing consumes (no nodes left): the others' minima add to it
        outside[f - first] = sum((arrays[g] for g in roots if g != f), np.zeros(lead))
    nodes: dict[int, np.ndarray] = {}
    pairs: dict[tuple[int, int], np.ndarray] = {}
    for i in reversed(range(len(program.steps))):
        x, scope, terms, shape = program.steps[i]
        axes = scope + [x]
        inside = outside[i][..., None]
        belief = tables[i] + inside
        nodes[x] = _reduce_to(belief, axes, [x], k)
        for t in terms:
            if t.factor < first and len(factor_nodes[t.factor]) == 2:
                u, v = factor_nodes[t.factor]
                pairs[u, v] = _reduce_to(belief, axes, [u, v], k)
            elif t.factor >= first:
                rest = _sum_terms([o for o in terms if o is not t], arrays, shape, lead) + inside
                outside[t.factor - first] = _reduce_to(rest, axes, program.steps[t.factor - first][1], k)
    return nodes, pairs
