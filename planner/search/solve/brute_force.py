"""Exhaustive reference solver for small problems: every assignment times every checkpoint subset.

Vectorised with numpy over all assignments at once, so a problem with 4^8 assignments and three blocks
takes well under a second. It is the ground truth the ILP solvers are tested against.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from planner.search.solve.evaluate import evaluate_indexed, recompute_peak
from planner.search.solve.indexed import IndexedProblem, ProblemError
from planner.search.solve.problem import Problem, Solution

__all__ = ["MAX_BRUTE_FORCE_CASES", "brute_force"]

# Largest (assignments x checkpoint subsets) brute force agrees to enumerate.
MAX_BRUTE_FORCE_CASES = 20_000_000


def _all_assignments(sizes: list[int]) -> np.ndarray:
    """Every choice vector, one row each: shape (prod(sizes), len(sizes))."""
    grids = np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij")
    return np.stack([g.ravel() for g in grids], axis=1) if sizes else np.zeros((1, 0), dtype=np.int64)


def brute_force(problem: Problem) -> Solution:
    """The exact optimum by enumeration (status "optimal" or "infeasible" with min_feasible_budget).

    Ties in time are broken by the first assignment in enumeration order. Raises ProblemError when the
    problem has more than MAX_BRUTE_FORCE_CASES cases.
    """
    start = time.perf_counter()
    ip = IndexedProblem(problem)
    n_subsets = 2 ** len(ip.block_nodes) if ip.checkpointing else 1
    cases = int(np.prod(ip.sizes, dtype=float)) * n_subsets
    if cases > MAX_BRUTE_FORCE_CASES:
        raise ProblemError(f"brute force would enumerate {cases} cases (limit {MAX_BRUTE_FORCE_CASES}); use solve()")
    grid = _all_assignments(ip.sizes)
    rows = np.arange(len(grid))
    node_t = [ip.time[v][grid[:, v]] for v in range(ip.n)]
    node_r = [ip.recompute[v][grid[:, v]] for v in range(ip.n)]
    saved = [ip.saved[v][grid[:, v]] for v in range(ip.n)]
    edge_t = [e.cost[grid[:, e.src], grid[:, e.dst]] for e in ip.edges]
    edge_r = [e.recompute[grid[:, e.src], grid[:, e.dst]] for e in ip.edges]
    base_time = sum(node_t, np.zeros(len(grid))) + sum(edge_t, np.zeros(len(grid)))
    state = sum((ip.state[v][grid[:, v]] for v in range(ip.n)), np.zeros(len(grid), dtype=np.int64))
    all_saved = sum(saved, np.zeros(len(grid), dtype=np.int64))
    all_saved += sum((e.saved[grid[:, e.src], grid[:, e.dst]] for e in ip.edges if e.saved is not None),
                     np.zeros(len(grid), dtype=np.int64))
    work = [ip.transient[v][grid[:, v]] for v in range(ip.n)]  # per node: its or a conversion's into it
    for e in ip.edges:  # conversion working sets
        if e.transient is not None:
            work[e.dst] = np.maximum(work[e.dst], e.transient[grid[:, e.src], grid[:, e.dst]])
    transient = np.max(np.stack(work), axis=0) if ip.n else 0
    block_saved, block_peak, block_rec, block_kept = [], [], [], []
    for b, members in enumerate(ip.block_nodes):
        block_saved.append(sum((saved[v] for v in members), np.zeros(len(grid), dtype=np.int64)))
        block_peak.append(recompute_peak([saved[v] for v in members], [work[v] for v in members]))
        rec = sum((node_r[v] for v in members), np.zeros(len(grid)))
        rec = rec + sum((r for r, e in zip(edge_r, ip.edges) if ip.block_of[e.dst] == b), np.zeros(len(grid)))
        block_rec.append(rec)
        src = ip.block_input[b]
        block_kept.append(ip.input_bytes[b][grid[:, src]] if src is not None else np.full(len(grid), ip.input_bytes[b][0]))

    best: tuple[float, int, tuple[int, ...]] | None = None  # (time, row, subset)
    least: tuple[int, int, tuple[int, ...]] | None = None  # (peak, row, subset)
    subsets = (
        itertools.chain.from_iterable(itertools.combinations(range(len(ip.block_nodes)), k)
                                      for k in range(len(ip.block_nodes) + 1))
        if ip.checkpointing else [()]
    )
    for subset in subsets:
        t = base_time + sum((block_rec[b] for b in subset), np.zeros(len(grid)))
        mem = state + all_saved - sum((block_saved[b] for b in subset), np.zeros(len(grid), dtype=np.int64))
        mem = mem + sum((block_kept[b] for b in subset), np.zeros(len(grid), dtype=np.int64))
        for v, nbytes, blocks in ip.shared:  # kept once while any block reading it is checkpointed
            if blocks.intersection(subset):
                mem = mem + nbytes[grid[:, v]]
        top = transient
        for b in subset:
            top = np.maximum(top, block_peak[b])  # the recompute peak
        peak = mem + top
        i = int(np.argmin(peak))
        if least is None or peak[i] < least[0]:
            least = (int(peak[i]), i, subset)
        ok = rows[peak <= ip.budget]
        if len(ok):
            j = int(ok[np.argmin(t[ok])])
            if best is None or t[j] < best[0]:
                best = (float(t[j]), j, subset)

    assert least is not None
    status = "optimal" if best is not None else "infeasible"
    _, row, subset = best if best is not None else least
    choice = [int(c) for c in grid[row]]
    time_s, peak_bytes, _ = evaluate_indexed(ip, choice, subset)
    return Solution(
        status=status,
        choice={name: c for name, c in zip(ip.names, choice)},
        checkpointed=[ip.block_names[b] for b in subset],
        objective=time_s,
        gap=0.0,
        seconds=time.perf_counter() - start,
        solver="brute_force",
        peak_bytes=peak_bytes,
        min_feasible_budget=least[0] if best is None else None,
        method="brute_force",
    )
