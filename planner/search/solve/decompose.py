"""Cut a problem into outer nodes and chains of identical blocks, for the two-level solve.

A block can be collapsed into frontier points when everything entering it comes from one node (its port:
the block's input node, or the single source of its incoming edges) and everything leaving it leaves
from one node (its output node). Blocks are grouped into classes of identical blocks by comparing their
costs position by position (`Block.cls` is only a hint: blocks that differ form separate classes).
Consecutive blocks of one class where each one's output feeds only the next one form a *segment*: the
outer ILP only needs how many blocks of a segment use each frontier point, not which ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.errors import PlannerError
from planner.search.solve.frontier import BlockShape
from planner.search.solve.indexed import IndexedProblem

__all__ = ["NotDecomposable", "BlockClass", "Segment", "Decomposition", "decompose"]


class NotDecomposable(PlannerError, ValueError):
    """The problem's blocks do not have the single-port / single-output shape the two-level solve needs."""


@dataclass
class BlockClass:
    """Identical blocks (indices into the problem's blocks) and their shared shape."""

    shape: BlockShape
    blocks: list[int]


@dataclass
class Segment:
    """Blocks of one class in chain order: blocks[i+1]'s port is blocks[i]'s output node."""

    cls: int
    blocks: list[int]
    port: int | None  # node feeding blocks[0]
    out: int | None  # output node of blocks[-1]


@dataclass
class Decomposition:
    classes: list[BlockClass]
    segments: list[Segment]
    outer_nodes: list[int]  # nodes in no block
    ports: list[int | None]  # per block
    outs: list[int | None]  # per block
    block_class: list[int]


def _ports(ip: IndexedProblem) -> tuple[list[int | None], list[int | None]]:
    ports: list[int | None] = list(ip.block_input)
    outs: list[set[int]] = [set() for _ in ip.block_nodes]
    for e in ip.edges:
        bs, bd = ip.block_of[e.src], ip.block_of[e.dst]
        if bd >= 0 and bs != bd:
            if ports[bd] is None:
                ports[bd] = e.src
            elif ports[bd] != e.src:
                raise NotDecomposable(
                    f"block {ip.block_names[bd]!r} is fed by {ip.names[ports[bd]]!r} and {ip.names[e.src]!r}; "
                    "the two-level solve needs one input node per block"
                )
        if bs >= 0 and bs != bd:
            outs[bs].add(e.src)
    for src in ip.block_input:
        if src is not None and ip.block_of[src] >= 0:
            outs[ip.block_of[src]].add(src)
    for b, nodes in enumerate(outs):
        if len(nodes) > 1:
            names = sorted(ip.names[v] for v in nodes)
            raise NotDecomposable(f"block {ip.block_names[b]!r} has several output nodes {names}")
    return ports, [next(iter(o)) if o else None for o in outs]


def _shape(ip: IndexedProblem, b: int, port: int | None, out: int | None) -> BlockShape:
    members = ip.block_nodes[b]
    pos = {v: i for i, v in enumerate(members)}
    internal, from_port = [], []
    internal_work: dict[tuple[int, int], np.ndarray] = {}
    port_work: dict[int, np.ndarray] = {}
    for e in ip.edges:
        if ip.block_of[e.dst] != b:
            continue
        if ip.block_of[e.src] == b:
            internal.append((pos[e.src], pos[e.dst], e.cost, e.recompute))
            if e.transient is not None:
                internal_work[(pos[e.src], pos[e.dst])] = e.transient
        else:
            from_port.append((pos[e.dst], e.cost, e.recompute))
            if e.transient is not None:
                port_work[pos[e.dst]] = e.transient if pos[e.dst] not in port_work else np.maximum(
                    port_work[pos[e.dst]], e.transient)
    return BlockShape(
        sizes=[ip.sizes[v] for v in members], time=[ip.time[v] for v in members],
        recompute=[ip.recompute[v] for v in members], state=[ip.state[v] for v in members],
        saved=[ip.saved[v] for v in members], transient=[ip.transient[v] for v in members],
        internal=sorted(internal, key=lambda t: (t[0], t[1])), from_port=sorted(from_port, key=lambda t: t[0]),
        port_size=1 if port is None else ip.sizes[port], out_pos=None if out is None else pos[out],
        input_bytes=(ip.input_bytes[b] if ip.block_input[b] is not None
                     else np.full(1 if port is None else ip.sizes[port], ip.input_bytes[b][0])),
        internal_work=internal_work, port_work=port_work, labels=[ip.labels[v] for v in members],
    )


def _signature(shape: BlockShape, has_port: bool) -> tuple:
    def arr(a: np.ndarray) -> bytes:
        return np.ascontiguousarray(a).tobytes()

    nodes = tuple((arr(t), arr(r), arr(s), arr(v), arr(x)) for t, r, s, v, x in
                  zip(shape.time, shape.recompute, shape.state, shape.saved, shape.transient))
    internal = tuple((s, d, c.shape, arr(c), arr(r)) for s, d, c, r in shape.internal)
    port = tuple((d, c.shape, arr(c), arr(r)) for d, c, r in shape.from_port)
    work = (tuple((k, arr(w)) for k, w in sorted(shape.internal_work.items())),
            tuple((k, arr(w)) for k, w in sorted(shape.port_work.items())))
    labels = tuple(None if x is None else tuple(x) for x in shape.labels)
    return (tuple(shape.sizes), nodes, internal, port, has_port, shape.port_size, shape.out_pos, arr(shape.input_bytes),
            work, labels)


def decompose(ip: IndexedProblem) -> Decomposition:
    """Classes, segments and outer nodes of `ip`; raises NotDecomposable with the reason."""
    ports, outs = _ports(ip)
    out_owner = {v: b for b, v in enumerate(outs) if v is not None}
    for b, port in enumerate(ports):
        if port is not None and ip.block_of[port] >= 0 and port not in out_owner:
            raise NotDecomposable(f"block {ip.block_names[b]!r} is fed from inside another block")
    classes: list[BlockClass] = []
    by_sig: dict[tuple, int] = {}
    block_class = []
    for b in range(len(ip.block_nodes)):
        shape = _shape(ip, b, ports[b], outs[b])
        sig = _signature(shape, ports[b] is not None)
        if sig not in by_sig:
            by_sig[sig] = len(classes)
            classes.append(BlockClass(shape, []))
        classes[by_sig[sig]].blocks.append(b)
        block_class.append(by_sig[sig])
    # users of each output node: blocks it feeds (as port) and whether an outer node reads it
    fed: dict[int, list[int]] = {}
    for b, port in enumerate(ports):
        if port is not None:
            fed.setdefault(port, []).append(b)
    read_outside = {e.src for e in ip.edges if ip.block_of[e.dst] < 0}
    successor: dict[int, int] = {}
    for b, out in enumerate(outs):
        if out is None or out in read_outside or len(fed.get(out, [])) != 1:
            continue
        nxt = fed[out][0]
        if block_class[nxt] == block_class[b]:
            successor[b] = nxt
    has_pred = set(successor.values())
    segments = []
    placed = 0
    for b in range(len(ip.block_nodes)):
        if b in has_pred:
            continue
        chain = [b]
        while chain[-1] in successor:
            chain.append(successor[chain[-1]])
        placed += len(chain)
        segments.append(Segment(block_class[b], chain, ports[b], outs[chain[-1]]))
    if placed != len(ip.block_nodes):
        raise NotDecomposable("blocks feed each other in a cycle")
    outer = [v for v in range(ip.n) if ip.block_of[v] < 0]
    return Decomposition(classes, segments, outer, ports, outs, block_class)
