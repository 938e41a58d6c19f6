"""Random and synthetic `Problem`s for tests and benchmarks of the solvers.

`random_problem` makes small unstructured instances (random DAG, random blocks) for comparison with
brute force. `repeated_blocks` makes a chain of identical blocks between an embedding-like node and a
head-like node, the shape of a transformer stack: it exercises the two-level solver and reproduces the
DESIGN §6 scaling instance (8 heavy ops per block, 10 choices each).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from planner.search.solve.evaluate import evaluate_indexed
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.problem import Block, Choice, Problem, ProblemEdge, ProblemNode, SharedInput

__all__ = ["random_problem", "repeated_blocks", "encoder_decoder", "all_fastest_peak", "every_assignment"]


def every_assignment(ip: IndexedProblem) -> Iterator[tuple[list[int], list[int], float, int, int]]:
    """(choice vector, checkpointed blocks, time, peak, max term) of every assignment of a small problem:
    every choice vector with every set of checkpointed blocks, measured by `evaluate_indexed`."""
    blocks = range(len(ip.block_nodes))
    for choice in itertools.product(*(range(s) for s in ip.sizes)):
        for k in range(len(ip.block_nodes) + 1):
            for ckpt in itertools.combinations(blocks, k):
                time_s, peak, parts = evaluate_indexed(ip, list(choice), list(ckpt))
                yield list(choice), list(ckpt), time_s, peak, parts["transient_bytes"]


def _choices(rng: np.random.Generator, n: int, mem: int = 1000) -> list[Choice]:
    out = []
    for _ in range(n):
        t = float(rng.uniform(1.0, 10.0)) * 1e-3
        out.append(Choice(
            time_s=t, recompute_s=t * float(rng.uniform(0.2, 0.5)),
            state_bytes=int(rng.integers(0, mem)), saved_bytes=int(rng.integers(0, mem)),
            transient_bytes=int(rng.integers(0, mem)),
        ))
    return out


def _matrix(rng: np.random.Generator, n_src: int, n_dst: int, scale: float = 5e-3) -> np.ndarray:
    """Resharding-like costs: random, with some zero entries (layouts that already agree)."""
    mat = rng.uniform(0.0, scale, size=(n_src, n_dst))
    mat[rng.random((n_src, n_dst)) < 0.3] = 0.0
    return mat


def random_problem(
    rng: np.random.Generator, *, n_nodes: int = 6, max_choices: int = 4, edge_prob: float = 0.4,
    n_blocks: int = 2, checkpointing: bool = True, budget_fraction: float = 0.6,
) -> Problem:
    """A random DAG of `n_nodes` nodes with 1..max_choices choices, random edges (src before dst) and up
    to `n_blocks` blocks of consecutive nodes, each with a random input node before it (or none). The
    budget is `budget_fraction` of a rough upper bound on the peak, so some instances are infeasible."""
    sizes = [int(rng.integers(1, max_choices + 1)) for _ in range(n_nodes)]
    nodes = [ProblemNode(f"n{i}", _choices(rng, s)) for i, s in enumerate(sizes)]
    edges = []
    for j in range(1, n_nodes):
        for i in range(j):
            if rng.random() < edge_prob or (i == j - 1 and rng.random() < 0.5):
                cost = _matrix(rng, sizes[i], sizes[j])
                edges.append(ProblemEdge(f"n{i}", f"n{j}", cost, cost * rng.uniform(0.0, 0.7)))
    blocks = []
    cuts = sorted(rng.choice(np.arange(1, n_nodes), size=min(2 * n_blocks, n_nodes - 1), replace=False))
    for k in range(0, len(cuts) - 1, 2):
        members = list(range(int(cuts[k]), int(cuts[k + 1]) + 1))
        src = int(rng.integers(-1, members[0]))  # -1: no input node
        input_bytes = [int(x) for x in rng.integers(0, 600, size=sizes[src] if src >= 0 else 1)]
        name = f"b{len(blocks)}"
        blocks.append(Block(name, [f"n{i}" for i in members], f"n{src}" if src >= 0 else None, input_bytes))
        for i in members:
            nodes[i].block = name
    rough = sum(max(c.state_bytes + c.saved_bytes for c in n.choices) for n in nodes) + 1000
    return Problem(nodes, edges, blocks, int(budget_fraction * rough), checkpointing)


def repeated_blocks(
    rng: np.random.Generator, *, n_blocks: int = 4, block_nodes: int = 4, choices: int = 3,
    residual: bool = True, checkpointing: bool = True, budget_fraction: float = 0.55, mem: int = 1000,
    shared: list[int] | None = None,
) -> Problem:
    """embed -> n_blocks identical blocks -> head. Every node has `choices` options; node costs and edge
    matrices are drawn once and repeated by position, so all blocks form one class. With `residual`, the
    block input also feeds the block's middle node and the middle node feeds the last (a DAG block like a
    transformer layer). `shared`: bytes per choice of a node "table" that every block reads beside its
    input (a `SharedInput`, like LLaMA's rotary tables). Budget: `budget_fraction` of the all-fastest
    assignment's peak."""
    node_costs = [_choices(rng, choices, mem) for _ in range(block_nodes)]
    inner = [(i, i + 1, _matrix(rng, choices, choices)) for i in range(block_nodes - 1)]
    port = [(0, _matrix(rng, choices, choices))]
    mid = block_nodes // 2
    if residual and block_nodes >= 3:
        port.append((mid, _matrix(rng, choices, choices)))
        inner.append((mid, block_nodes - 1, _matrix(rng, choices, choices)))
    rec_frac = rng.uniform(0.2, 0.6)
    input_bytes = [int(x) for x in rng.integers(mem // 10, mem // 2, size=choices)]
    nodes = [ProblemNode("embed", _choices(rng, choices, mem))]
    edges: list[ProblemEdge] = []
    blocks: list[Block] = []
    prev = "embed"
    for k in range(n_blocks):
        names = [f"L{k}.op{i}" for i in range(block_nodes)]
        nodes += [ProblemNode(name, list(node_costs[i]), block=f"L{k}") for i, name in enumerate(names)]
        edges += [ProblemEdge(prev, names[j], m, m * rec_frac) for j, m in port]
        edges += [ProblemEdge(names[i], names[j], m, m * rec_frac) for i, j, m in inner]
        blocks.append(Block(f"L{k}", names, prev, input_bytes, cls="layer"))
        prev = names[-1]
    nodes.append(ProblemNode("head", _choices(rng, choices, mem)))
    edges.append(ProblemEdge(prev, "head", _matrix(rng, choices, choices), np.zeros((choices, choices))))
    problem = Problem(nodes, edges, blocks, 0, checkpointing)
    if shared is not None:
        nodes.insert(1, ProblemNode("table", [Choice(float(t), 0.0, 0, 0, 0) for t in rng.uniform(0, 1, len(shared))]))
        problem.shared_inputs = [SharedInput("table", list(shared), [b.name for b in blocks])]
    problem.budget_bytes = int(budget_fraction * all_fastest_peak(problem))
    return problem


def encoder_decoder(
    rng: np.random.Generator, *, enc_blocks: int = 1, dec_blocks: int = 2, block_nodes: int = 2, choices: int = 3,
    budget_fraction: float = 0.55, mem: int = 1000,
) -> Problem:
    """The shape of T5: embed -> encoder blocks -> `memory` (the encoder output), then decoder blocks whose
    first node reads the previous block and whose last node also reads `memory` (cross-attention), so
    each decoder block has two input nodes and the blocks do not decompose. Costs are random per node;
    budget: `budget_fraction` of the all-fastest assignment's peak."""
    nodes = [ProblemNode("embed", _choices(rng, choices, mem))]
    edges: list[ProblemEdge] = []
    blocks: list[Block] = []

    def chain(prefix: str, count: int, prev: str, cross: str | None) -> str:
        for k in range(count):
            name = f"{prefix}{k}"
            names = [f"{name}.op{i}" for i in range(block_nodes)]
            nodes.extend(ProblemNode(n, _choices(rng, choices, mem), block=name) for n in names)
            links = [(prev, names[0])] + list(zip(names, names[1:])) + ([(cross, names[-1])] if cross else [])
            for src, dst in links:
                cost = _matrix(rng, choices, choices)
                edges.append(ProblemEdge(src, dst, cost, cost * 0.4))
            input_bytes = [int(x) for x in rng.integers(mem // 10, mem // 2, size=choices)]
            blocks.append(Block(name, names, prev, input_bytes))
            prev = names[-1]
        return prev

    last = chain("enc", enc_blocks, "embed", None)
    nodes.append(ProblemNode("memory", _choices(rng, choices, mem)))
    edges.append(ProblemEdge(last, "memory", _matrix(rng, choices, choices), np.zeros((choices, choices))))
    last = chain("dec", dec_blocks, "memory", "memory")
    nodes.append(ProblemNode("head", _choices(rng, choices, mem)))
    edges.append(ProblemEdge(last, "head", _matrix(rng, choices, choices), np.zeros((choices, choices))))
    problem = Problem(nodes, edges, blocks, 0)
    problem.budget_bytes = int(budget_fraction * all_fastest_peak(problem))
    return problem


def all_fastest_peak(problem: Problem) -> int:
    """Peak memory when every node takes its fastest choice and nothing is checkpointed."""
    fastest = [min(n.choices, key=lambda c: c.time_s) for n in problem.nodes]
    return sum(c.state_bytes + c.saved_bytes for c in fastest) + max((c.transient_bytes for c in fastest), default=0)
