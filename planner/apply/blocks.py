"""Checkpointed blocks: cut the tagged nodes of each block out of the rewritten graph into one region that
runs under non-reentrant `torch.utils.checkpoint` (layers3d.checkpoint, whose recompute context records the
re-run collectives as phase "recompute").

A block's region takes the values it reads from outside (its kept inputs) and returns the values read
after it. The regions and the remaining nodes are re-emitted in a stable topological order; a block that
is not a contiguous region of the data flow (something outside it both reads it and feeds it) is refused.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import torch.fx as fx
import torch.nn as nn

from layers3d.checkpoint import checkpoint
from planner.apply.graph import BLOCK_KEY
from planner.apply.values import ApplyError

__all__ = ["CheckpointedBlock", "extract_blocks", "KEPT_OBSERVERS"]

# Called with the inputs a checkpointed block keeps for its recomputation (outside autograd's saved
# tensors, so saved-tensor hooks do not see them). The runtime only announces; a measurement
# (`planner.verify.measure.SavedActivationMeter`) subscribes while it is active.
KEPT_OBSERVERS: list[Callable[[tuple[Any, ...]], None]] = []


class CheckpointedBlock(nn.Module):
    """Runs `body` (a graph of the parallel model) under activation checkpointing.

    The body's modules are registered on the parallel model, not here, so parameters keep their places
    and names; `bind(root)` (re)builds the body against the root's modules and tensors.
    """

    def __init__(self, name: str, graph: fx.Graph) -> None:
        super().__init__()
        self.block = name
        self._graph = graph
        self._body: fx.GraphModule | None = None

    def bind(self, root: nn.Module) -> None:
        self.__dict__["_body"] = fx.GraphModule(root, self._graph, f"Checkpointed_{self.block.replace('.', '_')}")

    def forward(self, *inputs: Any) -> Any:
        if self._body is None:
            raise AssertionError("CheckpointedBlock used before bind()")
        for observe in KEPT_OBSERVERS:  # checkpoint keeps its inputs for the recomputation
            observe(inputs)
        return checkpoint(self._body, *inputs)

    def extra_repr(self) -> str:
        return f"block={self.block!r}, nodes={len(self._graph.nodes)}"


def _units(nodes: list[fx.Node]) -> tuple[dict[fx.Node, str | fx.Node], dict[str | fx.Node, list[fx.Node]]]:
    unit_of: dict[fx.Node, str | fx.Node] = {}
    members: dict[str | fx.Node, list[fx.Node]] = {}
    for n in nodes:
        u = n.meta.get(BLOCK_KEY) or n
        unit_of[n] = u
        members.setdefault(u, []).append(n)
    return unit_of, members


def _order(nodes: list[fx.Node], unit_of: dict, members: dict) -> list[str | fx.Node]:
    """Units in a topological order that keeps the original order where it can (Kahn's algorithm)."""
    pos = {n: i for i, n in enumerate(nodes)}
    first = {u: min(pos[n] for n in ns) for u, ns in members.items()}
    deps: dict[Any, set] = {u: set() for u in members}
    users: dict[Any, set] = {u: set() for u in members}
    for n in nodes:
        for src in n.all_input_nodes:
            a, b = unit_of[src], unit_of[n]
            if a != b:
                deps[b].add(a)
                users[a].add(b)
    ready = [(first[u], i, u) for i, u in enumerate(members) if not deps[u]]
    heapq.heapify(ready)
    index = {u: i for i, u in enumerate(members)}
    out = []
    while ready:
        _, _, u = heapq.heappop(ready)
        out.append(u)
        for v in users[u]:
            deps[v].discard(u)
            if not deps[v]:
                heapq.heappush(ready, (first[v], index[v], v))
    if len(out) != len(members):
        stuck = sorted({u for u in members if u not in out and isinstance(u, str)})
        raise ApplyError(f"checkpointed block(s) {stuck} are not contiguous regions of the graph: an op outside "
                         "reads a block's output and feeds the block again; checkpoint them separately or not at all")
    return out


def extract_blocks(graph: fx.Graph, name_of: Callable[[str], str]) -> tuple[fx.Graph, dict[str, CheckpointedBlock]]:
    """A new graph in which every tagged block is one call of a `CheckpointedBlock` module (registered
    under `name_of(block)`); returns the graph and those modules."""
    nodes = list(graph.nodes)
    unit_of, members = _units(nodes)
    out = fx.Graph()
    env: dict[fx.Node, Any] = {}
    blocks: dict[str, CheckpointedBlock] = {}
    for u in _order(nodes, unit_of, members):
        if not isinstance(u, str):
            env[u] = out.node_copy(u, env.__getitem__)
            continue
        inside = members[u]
        inside_set = set(inside)
        inputs = list(dict.fromkeys(src for n in inside for src in n.all_input_nodes if src not in inside_set))
        outputs = [n for n in inside if any(user not in inside_set for user in n.users)]
        body = fx.Graph()
        benv: dict[fx.Node, Any] = {}
        for i, src in enumerate(inputs):
            benv[src] = body.placeholder(f"in_{i}_{src.name}")
        for n in inside:
            benv[n] = body.node_copy(n, benv.__getitem__)
        body.output(benv[outputs[0]] if len(outputs) == 1 else tuple(benv[o] for o in outputs))
        name = name_of(u)
        blocks[name] = CheckpointedBlock(u, body)
        call = out.call_module(name, tuple(env[src] for src in inputs))
        if len(outputs) == 1:
            env[outputs[0]] = call
        else:
            for k, o in enumerate(outputs):
                env[o] = out.call_function(_item, (call, k))
    return out, blocks


def _item(x: Any, k: int) -> Any:
    return x[k]
