"""An integer-indexed, validated view of a `Problem`, shared by every solver.

Solvers work on node indices and numpy arrays rather than names and dataclasses. Building the view checks
the problem once (unknown names, shape mismatches, a node in two blocks, negative bytes...) and raises a
`ProblemError` that says what is wrong, so the solvers can rely on a well-formed input. Parallel edges
between the same pair of nodes are merged (their matrices summed): the formulas only ever add them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cost_models.errors import PlannerError
from planner.search.solve.frontier import topological_order
from planner.search.solve.problem import Problem, ProblemEdge

__all__ = ["ProblemError", "HeldRow", "IndexedEdge", "IndexedProblem", "fold_fixed_edges", "fold_shared_inputs"]


class ProblemError(PlannerError, ValueError):
    """The `Problem` handed to a solver is malformed; the message names the offending node/edge/block."""


@dataclass(frozen=True)
class IndexedEdge:
    """A merged edge: src/dst node indices, forward+backward cost and checkpoint recompute matrices."""

    src: int
    dst: int
    cost: np.ndarray
    recompute: np.ndarray
    transient: np.ndarray | None = None  # int64 working-set bytes per choice pair (None: all zero)
    saved: np.ndarray | None = None  # int64 bytes dst saves per choice pair (None: all zero; dst in no block)
    # ... the working set where dst's block is not checkpointed (None: `transient`; `ProblemEdge`)
    transient_unckpt: np.ndarray | None = None

    def unckpt(self) -> np.ndarray | None:
        """The working set where dst's block is not checkpointed (None: all zero)."""
        return self.transient if self.transient_unckpt is None else self.transient_unckpt


def _finite(values: np.ndarray, what: str) -> None:
    if not np.all(np.isfinite(values)):
        raise ProblemError(f"{what} contains NaN or infinite values; costs must be finite numbers")


def _bytes_array(values: list[int], what: str, signed: bool = False) -> np.ndarray:
    arr = np.asarray(values, dtype=np.int64)
    if not signed and np.any(arr < 0):
        raise ProblemError(f"{what} has negative bytes {values}; memory sizes must be >= 0")
    return arr


@dataclass(frozen=True)
class HeldRow:
    """A `Problem.held_beside` entry by node index: at an op of node `node`, own[c] under its choice c, nbytes[j]
    per (node, nbytes) of `terms` under that node's choice j, nbytes[i, j] per (a, b, nbytes) of `pairs`, plus
    `floor`; at a checkpointed block's recomputation where `recomputation`; with the working set of the conversion
    into it from node `source` (the edge between them) where that is not None."""

    node: int
    own: np.ndarray
    terms: list[tuple[int, np.ndarray]]
    floor: int
    recomputation: bool
    source: int | None
    pairs: list[tuple[int, int, np.ndarray]]
    recomputed: list[tuple[int, np.ndarray]]  # with `recomputation`: per earlier node of the block, its bytes
    recomputed_pairs: list[tuple[int, int, np.ndarray]]  # ... and per pair of nodes
    # (u, bytes, conditions): `problem.Apart`, each condition (a, b or None, breaks over a's (and b's) choices)
    apart: list[tuple[int, np.ndarray, list[tuple[int, int | None, np.ndarray]]]]

    def value(self, choice: Sequence[int]) -> int:
        """The bytes of the row's own, terms, pairs, apart terms and floor under an assignment (not the conversion's
        nor the recomputed activations of `recomputed` and `recomputed_pairs`)."""
        return (int(self.own[choice[self.node]]) + self.floor + sum(int(b[choice[u]]) for u, b in self.terms)
                + sum(int(b[choice[u], choice[w]]) for u, w, b in self.pairs)
                + sum(int(b[choice[u]]) for u, b, conditions in self.apart if any(
                    m[choice[x]] if y is None else m[choice[x], choice[y]] for x, y, m in conditions)))

    def restricted(self, keep: list[np.ndarray], memo: dict[int, tuple[object, object]] | None = None) -> HeldRow:
        """The row with node v's options cut to keep[v] (`fixing.restrict`); `memo`: the terms cut so far, by
        identity (rows share their terms: each is cut once)."""
        memo = {} if memo is None else memo

        def cut(term: tuple, how: Callable[[tuple], object]) -> object:
            got = memo.get(id(term))
            if got is None or got[0] is not term:
                got = memo[id(term)] = (term, how(term))
            return got[1]

        def vector(t: tuple) -> tuple:
            return t[0], t[1][keep[t[0]]]

        def pair(t: tuple) -> tuple:
            return t[0], t[1], t[2][np.ix_(keep[t[0]], keep[t[1]])]

        def apart(t: tuple) -> tuple:
            return t[0], t[1][keep[t[0]]], [(x, y, m[keep[x]] if y is None else m[np.ix_(keep[x], keep[y])])
                                            for x, y, m in t[2]]

        return HeldRow(self.node, self.own[keep[self.node]], [cut(t, vector) for t in self.terms], self.floor,
                       self.recomputation, self.source, [cut(t, pair) for t in self.pairs],
                       [cut(t, vector) for t in self.recomputed], [cut(t, pair) for t in self.recomputed_pairs],
                       [cut(t, apart) for t in self.apart])


def _both(a: np.ndarray | None, b: np.ndarray | None, combine: Callable[[np.ndarray, np.ndarray], np.ndarray]
          ) -> np.ndarray | None:
    """Two optional bytes matrices of merged edges combined (None: all zero, the other one as it is)."""
    return b if a is None else (a if b is None else combine(a, b))


class IndexedProblem:
    """Validated arrays of a `Problem`.

    Per node v: `sizes[v]` choices and arrays `time[v]`, `recompute[v]`, `state[v]`, `saved[v]`,
    `transient[v]` indexed by choice. Per block b: `block_nodes[b]` (node indices in forward order),
    `block_input[b]` (the input node's index or None) and `input_bytes[b]` (indexed by the input node's
    choice; one entry, choice 0, when the block has no input node). `block_of[v]` is v's block or -1.
    Per shared input k (`Problem.shared_inputs`): `shared[k]` = (its node's index, bytes per that node's
    choice, the set of indices of the blocks that keep it when checkpointed).
    """

    def __init__(self, problem: Problem, budget: int | None = None) -> None:
        """`budget`: the per-rank bytes to solve for (default: `problem.budget_bytes`)."""
        self.problem = problem
        self.budget = int(problem.budget_bytes if budget is None else budget)
        if self.budget < 0:
            raise ProblemError(f"the budget is {self.budget} bytes; it must be >= 0")
        self.checkpointing = bool(problem.checkpointing)
        self.names: list[str] = [n.name for n in problem.nodes]
        self.index: dict[str, int] = {}
        for i, name in enumerate(self.names):
            if name in self.index:
                raise ProblemError(f"node name {name!r} appears twice; node names must be unique")
            self.index[name] = i
        self._read_nodes()
        self.labels: list[np.ndarray | None] = []
        for node in problem.nodes:
            if node.labels is not None and len(node.labels) != len(node.choices):
                raise ProblemError(f"node {node.name!r} has {len(node.labels)} labels for {len(node.choices)} choices")
            self.labels.append(None if node.labels is None else np.array(node.labels, dtype=object))
        self._read_edges()
        self._read_blocks()
        self._read_shared()
        self._read_held()
        self._read_held_saved()

    @property
    def n(self) -> int:
        return len(self.names)

    def _read_nodes(self) -> None:
        self.sizes: list[int] = []
        self.time: list[np.ndarray] = []
        self.recompute: list[np.ndarray] = []
        self.state: list[np.ndarray] = []
        self.saved: list[np.ndarray] = []
        self.transient: list[np.ndarray] = []
        for node in self.problem.nodes:
            if not node.choices:
                raise ProblemError(f"node {node.name!r} has no choices; give it at least one option")
            self.sizes.append(len(node.choices))
            self.time.append(np.array([c.time_s for c in node.choices], dtype=float))
            self.recompute.append(np.array([c.recompute_s for c in node.choices], dtype=float))
            _finite(self.time[-1], f"node {node.name!r} time_s")
            _finite(self.recompute[-1], f"node {node.name!r} recompute_s")
            self.state.append(_bytes_array([c.state_bytes for c in node.choices], f"node {node.name!r} state"))
            self.saved.append(_bytes_array([c.saved_bytes for c in node.choices], f"node {node.name!r} saved"))
            self.transient.append(
                _bytes_array([c.transient_bytes for c in node.choices], f"node {node.name!r} transient")
            )
        # per node, its working set where its block is not checkpointed: its own, with the edges folded into it
        # (`fold_fixed_edges`) counting theirs (`IndexedEdge.transient_unckpt`)
        self.transient_unckpt: list[np.ndarray] = list(self.transient)

    def _node(self, name: str, where: str) -> int:
        if name not in self.index:
            raise ProblemError(f"{where} names node {name!r}, which is not in problem.nodes")
        return self.index[name]

    def _read_edges(self) -> None:
        merged: dict[tuple[int, int], list[np.ndarray]] = {}
        for e in self.problem.edges:
            src, dst = self._node(e.src, f"edge {e.src}->{e.dst}"), self._node(e.dst, f"edge {e.src}->{e.dst}")
            if src == dst:
                raise ProblemError(f"edge {e.src}->{e.dst} is a self-loop; edges join two different nodes")
            shape = (self.sizes[src], self.sizes[dst])
            cost = np.asarray(e.cost_s, dtype=float)
            rec = np.asarray(e.recompute_s, dtype=float)
            for what, mat in (("cost_s", cost), ("recompute_s", rec)):
                if mat.shape != shape:
                    raise ProblemError(
                        f"edge {e.src}->{e.dst} {what} has shape {mat.shape}; expected {shape} "
                        f"(choices of {e.src} x choices of {e.dst})"
                    )
                _finite(mat, f"edge {e.src}->{e.dst} {what}")
            work, kept = (self._edge_bytes(e, given, what, shape)
                          for given, what in ((e.transient_bytes, "transient_bytes"), (e.saved_bytes, "saved_bytes")))
            unckpt = work
            if e.transient_bytes_unckpt is not None:
                unckpt = self._edge_bytes(e, e.transient_bytes_unckpt, "transient_bytes_unckpt", shape, keep=True)
                if np.any(unckpt > (0 if work is None else work)):
                    raise ProblemError(f"edge {e.src}->{e.dst} transient_bytes_unckpt exceeds its transient_bytes; the "
                                       "working set where the block is not checkpointed is a part of it")
            if (src, dst) in merged:  # times and saved bytes add up; working sets do not coexist: the larger counts
                m = merged[(src, dst)]
                m[0], m[1] = m[0] + cost, m[1] + rec
                m[2], m[3], m[4] = _both(m[2], work, np.maximum), _both(m[3], kept, np.add), _both(m[4], unckpt, np.maximum)
            else:
                merged[(src, dst)] = [cost, rec, work, kept, unckpt]
        self.edges: list[IndexedEdge] = [IndexedEdge(s, d, c, r, w, k, None if u is w else u)
                                         for (s, d), (c, r, w, k, u) in merged.items()]

    @staticmethod
    def _edge_bytes(e: ProblemEdge, given: np.ndarray | None, what: str, shape: tuple[int, int], keep: bool = False
                    ) -> np.ndarray | None:
        """An edge's bytes matrix (transient or saved) checked against its shape; None when all zero (unless `keep`)."""
        if given is None:
            return None
        arr = np.asarray(given)
        if arr.shape != shape:
            raise ProblemError(f"edge {e.src}->{e.dst} {what} has shape {arr.shape}; expected {shape}")
        arr = _bytes_array(arr, f"edge {e.src}->{e.dst} {what}")
        return arr if arr.any() or keep else None

    def _read_blocks(self) -> None:
        self.block_names: list[str] = []
        self.block_nodes: list[list[int]] = []
        self.block_input: list[int | None] = []
        self.input_bytes: list[np.ndarray] = []
        self.block_of: list[int] = [-1] * self.n
        seen: set[str] = set()
        for b, block in enumerate(self.problem.blocks):
            if block.name in seen:
                raise ProblemError(f"block name {block.name!r} appears twice; block names must be unique")
            seen.add(block.name)
            if not block.nodes:
                raise ProblemError(f"block {block.name!r} has no nodes")
            members = [self._node(name, f"block {block.name!r}") for name in block.nodes]
            for v in members:
                if self.block_of[v] != -1:
                    raise ProblemError(
                        f"node {self.names[v]!r} is listed in blocks {self.block_names[self.block_of[v]]!r} "
                        f"and {block.name!r} (or twice in one); a node belongs to at most one block"
                    )
                self.block_of[v] = b
            src = None if block.input_node is None else self._node(block.input_node, f"block {block.name!r} input")
            if src is not None and self.block_of[src] == b:
                raise ProblemError(f"block {block.name!r} input_node {block.input_node!r} is inside the block")
            expected = 1 if src is None else self.sizes[src]
            given = list(block.input_bytes) or ([0] if src is None else [])
            if len(given) != expected:
                raise ProblemError(
                    f"block {block.name!r} input_bytes has {len(given)} entries; expected {expected} "
                    f"(one per choice of its input node, or at most one when input_node is None)"
                )
            self.block_names.append(block.name)
            self.block_nodes.append(members)
            self.block_input.append(src)
            self.input_bytes.append(_bytes_array(given, f"block {block.name!r} input_bytes"))
        self._forward_order()
        for e in self.edges:
            if e.saved is not None and self.block_of[e.dst] >= 0:
                raise ProblemError(
                    f"edge {self.names[e.src]}->{self.names[e.dst]} has saved_bytes but {self.names[e.dst]!r} is in "
                    f"block {self.block_names[self.block_of[e.dst]]!r}; only edges into nodes outside every block "
                    "may save bytes (put them in the node's own saved bytes)")
        for v, node in enumerate(self.problem.nodes):
            owner = self.block_names[self.block_of[v]] if self.block_of[v] >= 0 else None
            if node.block is not None and node.block != owner:
                raise ProblemError(
                    f"node {node.name!r} says it is in block {node.block!r} but "
                    + (f"block {owner!r} lists it" if owner else "no block lists it")
                    + "; make ProblemNode.block agree with Block.nodes"
                )

    def _forward_order(self) -> None:
        """Each block's nodes in an order where every edge inside the block runs forward (the listed order
        where it does; otherwise, among the nodes ready next, the one listed first): the order a checkpointed
        block's recompute peak follows (problem.py). A block whose edges form a cycle keeps its listed order."""
        for b, members in enumerate(self.block_nodes):
            position = {v: i for i, v in enumerate(members)}
            inside = [(position[e.src], position[e.dst]) for e in self.edges
                      if self.block_of[e.src] == b and self.block_of[e.dst] == b]
            order = topological_order(len(members), inside)
            if order is not None:
                self.block_nodes[b] = [members[i] for i in order]

    def _read_shared(self) -> None:
        self.shared: list[tuple[int, np.ndarray, frozenset[int]]] = []
        for k in self.problem.shared_inputs:
            v = self._node(k.node, f"shared input {k.node!r}")
            nbytes = _bytes_array(list(k.nbytes), f"shared input {k.node!r} nbytes")
            if len(nbytes) != self.sizes[v]:
                raise ProblemError(f"shared input {k.node!r} nbytes has {len(nbytes)} entries; expected "
                                   f"{self.sizes[v]} (one per choice of node {k.node!r})")
            if not k.blocks:
                raise ProblemError(f"shared input {k.node!r} names no blocks; list the blocks that read it")
            self.shared.append((v, nbytes, frozenset(self.block_index(b) for b in k.blocks)))

    @property
    def has_held(self) -> bool:
        """Whether the problem has rows the flat ILP counts only with `held=True` (`Problem.held_beside`,
        `held_saved`, `held_less`)."""
        return bool(self.held or self.held_saved or self.held_less or self.held_step is not None)

    def _choice_bytes(self, values: Sequence[int], v: int, what: str, signed: bool = False) -> np.ndarray:
        """Bytes per choice of node v, checked (`what` names them in the error; `signed`: a difference, may be < 0)."""
        arr = np.asarray(list(values), dtype=np.int64) if signed else _bytes_array(list(values), what)
        if len(arr) != self.sizes[v]:
            raise ProblemError(f"{what} has {len(arr)} entries; expected {self.sizes[v]} (one per choice of "
                               f"{self.names[v]!r})")
        return arr

    def _read_held_saved(self) -> None:
        """`held_saved[k]` per `Problem.held_saved` entry: (src's index, node's index, bytes per (src's choice,
        node's choice)); `held_less[k]` per `Problem.held_less` entry: (node's index, bytes per its choice, its clauses:
        per clause, (node index, per its choice whether) entries, `HeldLess.where`)."""
        self.held_saved = [x for h in self.problem.held_saved
                           for x in self._pair_bytes([(h.src, h.node, h.nbytes)], f"held_saved {h.node!r}", signed=True)]
        self.held_less = []
        for h in self.problem.held_less:
            label = f"held_less {h.node!r}"
            v = self._node(h.node, label)
            clauses = []
            for clause in h.where:
                checked = []
                for name, marks in clause:
                    u = self._node(name, label)
                    if len(marks) != self.sizes[u]:
                        raise ProblemError(f"{label} names {name!r} with {len(marks)} marks; expected {self.sizes[u]} "
                                           f"(one per choice of {name!r})")
                    checked.append((u, np.asarray(marks, dtype=bool)))
                if not checked:
                    raise ProblemError(f"{label} has an empty clause (it never holds); leave the entry out instead")
                clauses.append(checked)
            # taken off under clauses: the ILP counts it down to a product, exact for bytes >= 0 only
            self.held_less.append((v, self._choice_bytes(h.nbytes, v, label, signed=not clauses), clauses))
        # the optimizer step (`Problem.held_step`): (summed, per node its bytes per choice, fixed bytes)
        step = self.problem.held_step
        self.held_step: tuple[bool, list[np.ndarray], int] | None = None
        if step is not None:
            per = [np.zeros(n, dtype=np.int64) for n in self.sizes]
            for name, nbytes in step.nbytes:
                v = self._node(name, "held_step")
                per[v] = self._choice_bytes(nbytes, v, f"held_step bytes of {name!r}")
            self.held_step = (step.summed, per, int(step.fixed))

    def _pair_bytes(self, given: list[tuple[str, str, list[list[int]]]], where: str, signed: bool = False
                    ) -> list[tuple[int, int, np.ndarray]]:
        """(a, b, bytes per (a's choice, b's choice)) entries by node index, checked."""
        out = []
        for a, b, nbytes in given:
            ia, ib = self._node(a, where), self._node(b, where)
            arr = _bytes_array(np.asarray(nbytes), f"{where} bytes of ({a!r}, {b!r})", signed)
            if arr.shape != (self.sizes[ia], self.sizes[ib]) or ia == ib:
                raise ProblemError(f"{where} bytes of ({a!r}, {b!r}) have shape {arr.shape}; expected "
                                   f"{(self.sizes[ia], self.sizes[ib])} for two different nodes")
            out.append((ia, ib, arr))
        return out

    def _read_held(self) -> None:
        """`held[k]` per `Problem.held_beside` entry, with node indices and arrays (`HeldRow`). A term shared by many
        rows (the gradients at a block's trigger, the activations its re-run made before an op: the same objects in
        every row of the block) is read once."""
        self.held: list[HeldRow] = []
        read: dict[int, tuple[object, object]] = {}  # id -> (the term, as read): a term object read once

        def once(term: object, how: Callable[[object], object]) -> object:
            got = read.get(id(term))
            if got is None or got[0] is not term:
                got = read[id(term)] = (term, how(term))
            return got[1]

        def vector(where: str, what: str) -> Callable[[object], object]:
            def how(term: tuple) -> tuple[int, np.ndarray]:
                u = self._node(term[0], where)
                return u, self._choice_bytes(term[1], u, f"{where} {what} of {term[0]!r}")
            return how

        def pair(where: str) -> Callable[[object], object]:
            return lambda term: self._pair_bytes([term], where)[0]

        def apart(where: str) -> Callable[[object], object]:
            def how(term: tuple) -> tuple:
                name, nbytes, conditions = term
                u = self._node(name, where)
                if not conditions:
                    raise ProblemError(f"{where} apart term of {name!r} has no condition; give at least one")
                conds = []
                for a, b, breaks in conditions:
                    if b is None:
                        ia = self._node(a, where)
                        conds.append((ia, None, self._choice_bytes(np.asarray(breaks, dtype=np.int64), ia,
                                                                   f"{where} apart condition on {a!r}") != 0))
                    else:
                        (ia, ib, m), = self._pair_bytes([(a, b, np.asarray(breaks, dtype=np.int64))], f"{where} apart")
                        conds.append((ia, ib, m != 0))
                return u, self._choice_bytes(nbytes, u, f"{where} apart bytes of {name!r}"), conds
            return how

        for h in self.problem.held_beside:
            where = f"held_beside {h.node!r}"
            v = self._node(h.node, where)
            terms = [once(t, vector(where, "bytes")) for t in h.held]
            pairs = [once(t, pair(where)) for t in h.pairs]
            recomputed_pairs = [once(t, pair(where)) for t in h.recomputed_pairs]
            source = None if h.conversion_from is None else self._node(h.conversion_from, where)
            recomputed = [once(t, vector(where, "recomputed bytes")) for t in h.recomputed]
            if (recomputed or recomputed_pairs) and not h.recomputation:
                raise ProblemError(f"{where} has recomputed bytes but is not at a recomputation")
            aparts = [once(t, apart(where)) for t in h.apart]
            self.held.append(HeldRow(v, self._choice_bytes(h.own, v, f"{where} own"), terms, int(h.floor),
                                     bool(h.recomputation), source, pairs, recomputed, recomputed_pairs, aparts))
        unknown = sorted(set(self.problem.held_rerun) - set(self.block_names))
        if unknown:
            raise ProblemError(f"held_rerun names unknown blocks {unknown[:5]}; name blocks of problem.blocks")
        # blocks whose forward re-run the held rows count (`Problem.held_rerun`), by index
        self.held_rerun = frozenset(self.block_names.index(name) for name in self.problem.held_rerun)

    def shared_bytes(self, choice: Sequence[int], checkpointed: Iterable[int]) -> int:
        """The shared inputs kept by the checkpointed blocks `checkpointed` (problem.py's formula)."""
        ckpt = set(checkpointed)
        return sum(int(nbytes[choice[v]]) for v, nbytes, blocks in self.shared if blocks & ckpt)

    def vectors(self, choice: Mapping[str, int], checkpointed: Iterable[str]) -> tuple[list[int], list[int]]:
        """An assignment by names (a `Solution`'s choice and checkpointed blocks) as indices: the choice per node
        in `names` order, and the checkpointed blocks' indices."""
        return [choice[n] for n in self.names], [self.block_index(b) for b in checkpointed]

    def block_index(self, name: str) -> int:
        """The index of the block called `name` (ProblemError if unknown)."""
        try:
            return self.block_names.index(name)
        except ValueError:
            raise ProblemError(f"unknown block {name!r}; known blocks: {self.block_names}") from None

    def time_magnitude(self) -> float:
        """An upper bound on |step time| of any assignment, used to scale ILP objectives."""
        total = sum(float(np.max(np.abs(t))) + float(np.max(np.abs(r))) for t, r in zip(self.time, self.recompute))
        total += sum(float(np.max(np.abs(e.cost))) + float(np.max(np.abs(e.recompute))) for e in self.edges)
        return total if total > 0 else 1.0

    def memory_magnitude(self) -> int:
        """An upper bound on the bytes of any memory term (for choosing the ILP's memory unit)."""
        per_node = [int(s.max() + v.max() + t.max()) for s, v, t in zip(self.state, self.saved, self.transient)]
        total = sum(per_node) + sum(int(b.max()) for b in self.input_bytes)
        total += sum(int(nbytes.max()) for _, nbytes, _ in self.shared)
        total += max((int(e.transient.max()) for e in self.edges if e.transient is not None), default=0)
        total += sum(int(e.saved.max()) for e in self.edges if e.saved is not None)
        return max(total, self.budget, 1)

    def edge_saved(self, choice: Sequence[int]) -> int:
        """The bytes the edges' destinations save for these choices (`ProblemEdge.saved_bytes`)."""
        return sum(int(e.saved[choice[e.src], choice[e.dst]]) for e in self.edges if e.saved is not None)

    def memory_unit(self) -> int:
        """A power of two such that memory terms in that unit stay below 2^24: well scaled next to the 0/1
        variables, and with the solvers' feasibility tolerance (1e-9 here) far below one byte up to
        petabytes, so the memory row can be exact in whole bytes."""
        return 1 << max(0, math.ceil(math.log2(self.memory_magnitude() / 2**24)))


def fold_fixed_edges(ip: IndexedProblem) -> int:
    """Fold every edge with a one-choice end into the other end's own costs; returns how many were folded.

    An edge whose source has one choice is a vector over its destination's choices: its time, its
    recompute (counted when the destination's block is checkpointed, as the destination's own recompute
    is) and its working set (a candidate for the max term and for the destination's work) are exactly
    the destination's own terms (its working set where the block is not checkpointed, the node's
    `transient_unckpt`). An edge whose destination has one choice folds into its source the same
    way when both ends share a block (or it has no recompute or working set). Time and peak of every
    assignment are unchanged (`evaluate_indexed` gives the same figures), but HF graphs lose the edges
    from their one-choice mask and rotary tables into every layer, which let the blocks have one port
    (decomposable) and shrink the flat ILP. An edge's saved bytes join its node's saved bytes (that node is
    outside the blocks). Changes `ip` in place (its time, recompute, transient(_unckpt) and saved lists): call it on
    the solver's own view only.
    """
    kept: list[IndexedEdge] = []
    for e in ip.edges:
        if ip.sizes[e.src] == 1:
            into, row = e.dst, (lambda m: m[0])
        elif ip.sizes[e.dst] == 1 and (ip.block_of[e.src] == ip.block_of[e.dst]
                                       or (e.transient is None and not e.recompute.any()
                                           and (e.saved is None or ip.block_of[e.src] < 0))):
            into, row = e.src, (lambda m: m[:, 0])
        else:
            kept.append(e)
            continue
        ip.time[into] = ip.time[into] + row(e.cost)
        ip.recompute[into] = ip.recompute[into] + row(e.recompute)
        if e.transient is not None:
            ip.transient[into] = np.maximum(ip.transient[into], row(e.transient))
            ip.transient_unckpt[into] = np.maximum(ip.transient_unckpt[into], row(e.unckpt()))
        if e.saved is not None:  # both ends outside the blocks: never dropped, like the node's own
            ip.saved[into] = ip.saved[into] + row(e.saved)
    folded = len(ip.edges) - len(kept)
    ip.edges = kept
    return folded


def fold_shared_inputs(ip: IndexedProblem) -> int:
    """Where no assignment without a checkpointed block fits the budget, every answer keeps the shared
    inputs that all blocks read (problem.py): charge those to their (outer) nodes' saved bytes and drop
    them from `ip.shared`. The answers that fit and their peaks stay the same, and the priced search, whose
    per-block prices cannot see a term shared by blocks, then sees them too (its bounds stay valid and
    tighten). The proof is a lower bound of the least peak with nothing checkpointed above the budget: each
    node's least state and saved bytes, plus `_least_max_term`. At budget 0 (the least-memory search) it
    folds too, so that the least-memory answer is one at every budget that folds (`SolveMemo` keeps it for
    them); an assignment with nothing checkpointed is then counted with those inputs (an upper bound of its
    peak, measured exactly after). Changes `ip` in place: call
    it on the solver's own view, with `saved` and `shared` copied. Returns how many it folded."""
    if not ip.shared or not ip.checkpointing:
        return 0
    every = frozenset(range(len(ip.block_nodes)))
    folding = [k for k, (v, _, blocks) in enumerate(ip.shared) if ip.block_of[v] < 0 and blocks == every]
    if not folding:
        return 0
    least = sum(int((state + saved).min()) for state, saved in zip(ip.state, ip.saved))
    if least + _least_max_term(ip) <= ip.budget:
        return 0
    for k in folding:
        v, nbytes, _ = ip.shared[k]
        ip.saved[v] = ip.saved[v] + nbytes
    ip.shared = [x for k, x in enumerate(ip.shared) if k not in folding]
    return len(folding)


def _least_max_term(ip: IndexedProblem) -> int:
    """A lower bound of the max term of any assignment: per node, the least over its choices of the largest
    working set that choice meets among its own and its edges' (each edge at its other end's best choice
    for it), the largest over nodes. (HF LLaMA at its smallest budget: the logits' gather or the head's
    working set, whichever the head's choice avoids, 1 MiB; each edge alone proves half of that.)"""
    need = [t.astype(np.int64) for t in ip.transient]
    for e in ip.edges:
        if e.transient is None:
            continue
        with_src = np.maximum(e.transient, ip.transient[e.src][:, None])  # rows: src choice, cols: dst
        need[e.dst] = np.maximum(need[e.dst], with_src.min(axis=0))
        with_dst = np.maximum(e.transient, ip.transient[e.dst][None, :])
        need[e.src] = np.maximum(need[e.src], with_dst.min(axis=1))
    return max((int(n.min()) for n in need), default=0)
