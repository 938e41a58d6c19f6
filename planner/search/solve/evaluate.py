"""The time and memory of one assignment, straight from the formulas in `planner.search.solve.problem`.

Every solver's answer is re-evaluated here: reported objectives and peaks never come from an ILP's
floating-point values, and brute force, tests and the plan builder all use the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from planner.search.solve.indexed import IndexedProblem, ProblemError
from planner.search.solve.problem import Problem

__all__ = ["FastEvaluator", "evaluate", "evaluate_indexed", "held_bytes", "held_peak", "recompute_peak"]


def recompute_peak(saved: Sequence | np.ndarray, work: Sequence | np.ndarray) -> np.ndarray:
    """A checkpointed block's recompute peak (problem.py): over its nodes in the block's order (axis 0), the
    largest of the activations recomputed up to and including a node plus that node's working set. Per
    node one number, or one array of many assignments' values (then one peak per assignment)."""
    saved, work = np.asarray(saved, dtype=np.int64), np.asarray(work, dtype=np.int64)
    return np.max(np.cumsum(saved, axis=0) + work, axis=0)


def _working_sets(ip: IndexedProblem, choice: Sequence[int]) -> tuple[list[int], int]:
    """Per node its working set or the largest conversion's into it, and the largest conversion's anywhere."""
    work = [int(ip.transient[v][c]) for v, c in enumerate(choice)]
    conversion = 0
    for e in ip.edges:
        if e.transient is not None:
            w = int(e.transient[choice[e.src], choice[e.dst]])
            conversion = max(conversion, w)
            work[e.dst] = max(work[e.dst], w)
    return work, conversion


def _block_peak(ip: IndexedProblem, choice: Sequence[int], work: Sequence[int], b: int) -> int:
    """Block b's recompute peak (`recompute_peak`) under an assignment, with the nodes' working sets `work`."""
    members = ip.block_nodes[b]
    return int(recompute_peak([ip.saved[v][choice[v]] for v in members], [work[v] for v in members]))


def evaluate_indexed(
    ip: IndexedProblem, choice: Sequence[int], checkpointed: Iterable[int]
) -> tuple[float, int, dict[str, float]]:
    """`evaluate` on an indexed problem: `choice[v]` per node index, checkpointed block indices."""
    ckpt = set(checkpointed)
    in_ckpt = [ip.block_of[v] in ckpt for v in range(ip.n)]
    node_s = sum(float(ip.time[v][c]) for v, c in enumerate(choice))
    edge_s = sum(float(e.cost[choice[e.src], choice[e.dst]]) for e in ip.edges)
    recompute_s = sum(float(ip.recompute[v][c]) for v, c in enumerate(choice) if in_ckpt[v])
    recompute_s += sum(float(e.recompute[choice[e.src], choice[e.dst]]) for e in ip.edges if in_ckpt[e.dst])
    state = sum(int(ip.state[v][c]) for v, c in enumerate(choice))
    saved = sum(int(ip.saved[v][c]) for v, c in enumerate(choice) if not in_ckpt[v]) + ip.edge_saved(choice)
    kept = 0
    recomputed = 0
    work, conversion = _working_sets(ip, choice)
    for b in ckpt:
        src = ip.block_input[b]
        kept += int(ip.input_bytes[b][0 if src is None else choice[src]])
        recomputed = max(recomputed, _block_peak(ip, choice, work, b))
    kept += ip.shared_bytes(choice, ckpt)
    max_transient = max((int(ip.transient[v][c]) for v, c in enumerate(choice)), default=0)
    transient = max(max_transient, conversion, recomputed)
    peak = state + saved + kept + transient
    time_s = node_s + edge_s + recompute_s
    breakdown: dict[str, float] = {
        "time_s": time_s,
        "node_s": node_s,
        "edge_s": edge_s,
        "recompute_s": recompute_s,
        "peak_bytes": peak,
        "state_bytes": state,
        "saved_bytes": saved,
        "kept_input_bytes": kept,
        "transient_bytes": transient,
        "max_op_transient_bytes": max_transient,
        "max_conversion_bytes": conversion,
        "recomputed_bytes": recomputed,
    }
    return time_s, peak, breakdown


def held_bytes(ip: IndexedProblem, choice: Sequence[int], checkpointed: Iterable[int]) -> int:
    """The largest `ip.held` row (`Problem.held_beside`) under an assignment: what the flat ILP's max term covers
    beyond the formulas' transient (`evaluate_indexed`), which leaves these rows out; 0 without rows. A row at a
    recomputation counts where its block is checkpointed, with the activations recomputed before it."""
    ckpt = set(checkpointed)
    edges = {(e.src, e.dst): e for e in ip.edges}
    most = 0
    for row in ip.held:
        blk = ip.block_of[row.node]
        if row.recomputation and blk not in ckpt:
            continue
        value = row.value(choice)
        if row.source is not None:
            e = edges.get((row.source, row.node))
            if e is None or e.transient is None:
                continue
            value += int(e.transient[choice[row.source], choice[row.node]])
        value += sum(int(nbytes[choice[u]]) for u, nbytes in row.recomputed)
        value += sum(int(nbytes[choice[u], choice[w]]) for u, w, nbytes in row.recomputed_pairs)
        most = max(most, value)
    return most


def held_peak(ip: IndexedProblem, choice: Sequence[int], checkpointed: Iterable[int]) -> int:
    """The peak the flat ILP with held rows (`build_flat(held=True)`) counts for an assignment: the formulas' peak
    (`evaluate_indexed`) with the copies saved beyond them (`ip.held_saved`) and without what they may count twice
    (`ip.held_less`, where its clauses hold; both only for nodes outside checkpointed blocks), its
    max term with each working set where the block is not checkpointed (`transient_unckpt`: a conversion's less what
    the op saves), the recompute rows of the checkpointed blocks whose forward re-run the held rows do not count
    (`ip.held_rerun`) and the largest held row (`held_bytes`) as one more candidate."""
    ckpt = set(checkpointed)
    _, peak, parts = evaluate_indexed(ip, choice, ckpt)
    copies = sum(int(nbytes[choice[u], choice[v]]) for u, v, nbytes in ip.held_saved if ip.block_of[v] not in ckpt)
    copies -= sum(int(nbytes[choice[v]]) for v, nbytes, where in ip.held_less if ip.block_of[v] not in ckpt
                  and all(any(marks[choice[u]] for u, marks in clause) for clause in where))
    # the formulas' recompute rows, where the held rows do not count the block's forward re-run (`Problem.held_rerun`)
    sets = _working_sets(ip, choice)[0]
    work = max([_block_peak(ip, choice, sets, b) for b in ckpt - ip.held_rerun]
               + [int(t[c]) for t, c in zip(ip.transient_unckpt, choice)]
               + [int(e.unckpt()[choice[e.src], choice[e.dst]]) for e in ip.edges if e.transient is not None])
    held = peak - int(parts["transient_bytes"]) + copies + max(work, held_bytes(ip, choice, ckpt))
    if ip.held_step is None:
        return held
    summed, per, fixed = ip.held_step  # the optimizer step beside the states (`Problem.held_step`)
    step = [int(nbytes[c]) for nbytes, c in zip(per, choice)]
    return max(held, int(parts["state_bytes"]) + fixed + (sum(step) if summed else max(step, default=0)))


def evaluate(
    problem: Problem | IndexedProblem, choice: Mapping[str, int], checkpointed: Iterable[str] = ()
) -> tuple[float, int, dict[str, float]]:
    """Step time (s), peak bytes and a breakdown for one option per node and a set of checkpointed blocks.

    Implements the module docstring of `planner.search.solve.problem` term by term. The breakdown holds the
    totals: `node_s`, `edge_s`, `recompute_s` (their sum is the time), `state_bytes`, `saved_bytes`
    (activations of non-checkpointed nodes), `kept_input_bytes` (inputs kept by checkpointed blocks, shared
    inputs among them) and
    `transient_bytes` (the max term: the larger of `max_op_transient_bytes` and `recomputed_bytes`).
    Raises ProblemError when a node has no choice or an out-of-range one, or a block is unknown.
    """
    ip = problem if isinstance(problem, IndexedProblem) else IndexedProblem(problem)
    missing = [name for name in ip.names if name not in choice]
    if missing:
        raise ProblemError(f"choice has no entry for nodes {missing[:5]}; give one option index per node")
    unknown = sorted(set(choice) - set(ip.index))
    if unknown:
        raise ProblemError(f"choice names unknown nodes {unknown[:5]}")
    vec = [int(choice[name]) for name in ip.names]
    for v, c in enumerate(vec):
        if not 0 <= c < ip.sizes[v]:
            raise ProblemError(f"choice {c} for node {ip.names[v]!r} is out of range 0..{ip.sizes[v] - 1}")
    blocks = [ip.block_index(name) for name in checkpointed]
    if blocks and not ip.checkpointing:
        raise ProblemError("checkpointed blocks given but problem.checkpointing is False")
    return evaluate_indexed(ip, vec, blocks)


class FastEvaluator:
    """`evaluate_indexed`'s time and peak for many assignments of one problem, with numpy gathers instead
    of a Python loop per node and edge (the priced search evaluates hundreds of assignments of graphs
    with thousands of nodes). The sums run in the same order as `evaluate_indexed`'s (np.cumsum adds left
    to right, as `sum` does), so both give the same floats; the problem must not change after this is
    built (`fold_fixed_edges` first)."""

    def __init__(self, ip: IndexedProblem) -> None:
        self.ip = ip
        self.n = ip.n
        self.offset = np.concatenate([[0], np.cumsum(ip.sizes)[:-1]]).astype(np.int64)
        self.time = np.concatenate([np.asarray(t, dtype=float) for t in ip.time])
        self.recompute = np.concatenate([np.asarray(r, dtype=float) for r in ip.recompute])
        self.state = np.concatenate([np.asarray(s, dtype=np.int64) for s in ip.state])
        self.saved = np.concatenate([np.asarray(s, dtype=np.int64) for s in ip.saved])
        self.transient = np.concatenate([np.asarray(t, dtype=np.int64) for t in ip.transient])
        self.block_of = np.asarray(ip.block_of, dtype=np.int64)
        edges = ip.edges
        self.src = np.array([e.src for e in edges], dtype=np.int64)
        self.dst = np.array([e.dst for e in edges], dtype=np.int64)
        self.cols = np.array([e.cost.shape[1] for e in edges], dtype=np.int64)
        starts = np.cumsum([0] + [e.cost.size for e in edges])[:-1]
        self.edge_offset = np.asarray(starts, dtype=np.int64)
        self.edge_cost = np.concatenate([e.cost.ravel() for e in edges]) if edges else np.zeros(0)
        self.edge_recompute = np.concatenate([e.recompute.ravel() for e in edges]) if edges else np.zeros(0)
        self.worked, self.edge_work, self.work_offset = self._flat_bytes([e.transient for e in edges])
        self.keeping, self.edge_saved, self.saved_offset = self._flat_bytes([e.saved for e in edges])
        self.members = [np.asarray(m, dtype=np.int64) for m in ip.block_nodes]

    @staticmethod
    def _flat_bytes(mats: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-edge bytes matrices (None: none) laid flat: the edges that have one, their values
        concatenated, and where each edge's values start."""
        have = [k for k, m in enumerate(mats) if m is not None]
        values = np.concatenate([mats[k].ravel().astype(np.int64) for k in have]) if have else np.zeros(0, dtype=np.int64)
        starts = np.asarray(np.cumsum([0] + [mats[k].size for k in have])[:-1], dtype=np.int64)
        return np.array(have, dtype=np.int64), values, starts

    def _edge_bytes(self, edges: np.ndarray, values: np.ndarray, starts: np.ndarray, c: np.ndarray) -> np.ndarray:
        """The flat bytes (`_flat_bytes`) of `edges` at the choices `c` of their ends."""
        return values[starts + c[self.src[edges]] * self.cols[edges] + c[self.dst[edges]]]

    @staticmethod
    def _sum(values: np.ndarray) -> float:
        """Left-to-right float sum, as Python's `sum` adds."""
        return float(np.cumsum(values)[-1]) if len(values) else 0

    def __call__(self, choice: Sequence[int], checkpointed: Iterable[int]) -> tuple[float, int]:
        ip = self.ip
        c = np.asarray(choice, dtype=np.int64)
        ckpt = sorted(set(checkpointed))
        at = self.offset + c
        in_ckpt = np.isin(self.block_of, ckpt) if ckpt else np.zeros(self.n, dtype=bool)
        pair = self.edge_offset + c[self.src] * self.cols + c[self.dst]
        node_s = self._sum(self.time[at])
        edge_s = self._sum(self.edge_cost[pair])
        recompute_s = self._sum(self.recompute[at][in_ckpt])
        recompute_s += self._sum(self.edge_recompute[pair][in_ckpt[self.dst]])
        state = int(self.state[at].sum())
        saved = int(self.saved[at][~in_ckpt].sum())
        saved += int(self._edge_bytes(self.keeping, self.edge_saved, self.saved_offset, c).sum())
        own = self.transient[at]
        work = own.copy()
        conversion = 0
        if len(self.worked):
            w = self._edge_bytes(self.worked, self.edge_work, self.work_offset, c)
            conversion = int(w.max())
            np.maximum.at(work, self.dst[self.worked], w)
        kept = recomputed = 0
        node_saved = self.saved[at]
        for b in ckpt:
            src = ip.block_input[b]
            kept += int(ip.input_bytes[b][0 if src is None else c[src]])
            m = self.members[b]
            recomputed = max(recomputed, int(recompute_peak(node_saved[m], work[m])))
        kept += ip.shared_bytes(c, ckpt)
        transient = max(int(own.max()) if self.n else 0, conversion, recomputed)
        return node_s + edge_s + recompute_s, state + saved + kept + transient
