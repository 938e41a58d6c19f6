"""The time and memory of one assignment, straight from the formulas in `planner.search.solve.problem`.

Every solver's answer is re-evaluated here: reported objectives and peaks never come from an ILP's
floating-point values, and brute force, tests and the plan builder all use the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from planner.search.solve.indexed import IndexedProblem, ProblemError
from planner.search.solve.problem import Problem

__all__ = ["evaluate", "evaluate_indexed"]


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
    saved = sum(int(ip.saved[v][c]) for v, c in enumerate(choice) if not in_ckpt[v])
    kept = 0
    recomputed = 0
    work = [int(ip.transient[v][c]) for v, c in enumerate(choice)]  # per node: its or a conversion's into it
    conversion = 0
    for e in ip.edges:
        if e.transient is not None:
            w = int(e.transient[choice[e.src], choice[e.dst]])
            conversion = max(conversion, w)
            work[e.dst] = max(work[e.dst], w)
    for b in ckpt:
        src = ip.block_input[b]
        kept += int(ip.input_bytes[b][0 if src is None else choice[src]])
        members = ip.block_nodes[b]
        recomputed = max(recomputed, sum(int(ip.saved[v][choice[v]]) for v in members)
                         + max(work[v] for v in members))
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


def evaluate(
    problem: Problem | IndexedProblem, choice: Mapping[str, int], checkpointed: Iterable[str] = ()
) -> tuple[float, int, dict[str, float]]:
    """Step time (s), peak bytes and a breakdown for one option per node and a set of checkpointed blocks.

    Implements the module docstring of `planner.search.solve.problem` term by term. The breakdown holds the
    totals: `node_s`, `edge_s`, `recompute_s` (their sum is the time), `state_bytes`, `saved_bytes`
    (activations of non-checkpointed nodes), `kept_input_bytes` (inputs kept by checkpointed blocks) and
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
