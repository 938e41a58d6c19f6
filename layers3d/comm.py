"""Collectives over mesh axes, and the counter that records them.

Every function takes the local tensor, the mesh axes of the group (in the order that defines block
order, first axis outermost) and the `DeviceMesh`. Results follow that order whatever the order of the
underlying process group: all_gather concatenates chunks in requested-axes order, reduce_scatter gives
each rank the chunk of its position, all_to_all sends chunk p to position p. Empty `axes` (or a group of
one rank) is a no-op that returns the input and records nothing.

`interleave=k` (gather / scatter on the last dim only): the dim holds k equal segments, each split on its
own (fused q/k/v), so chunks are concatenated / cut per segment.

When a `CommCounter` is active every collective records a `cost_models.strategy.Collective` with the
ARCHITECTURE bytes convention: the gathered output (all_gather), the unreduced input (reduce_scatter,
all_reduce), the local tensor (all_to_all, broadcast). The phase is "forward", "backward" (inside
autograd's backward) or "recompute" (inside `recompute_phase()`, the recompute context that
`layers3d.checkpoint` gives torch.utils.checkpoint). Every collective runs inside `layers3d.inflight.tracked`,
so a watchdog can say which one a rank waits in past its deadline.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import torch
import torch.distributed as dist

from cost_models.strategy import Collective
from layers3d.inflight import tracked
from layers3d.mesh import DeviceMesh

__all__ = [
    "CommCounter", "recompute_phase", "current_phase", "all_gather", "reduce_scatter", "all_reduce",
    "all_to_all", "broadcast", "split_chunks", "cat_chunks",
]

_COUNTERS: list[CommCounter] = []  # global, not thread-local: autograd may run backward on another thread
_PHASES = threading.local()


class CommCounter:
    """Context manager that records every collective run while it is active.

    `records` is the list of `Collective(kind, axes, bytes, phase, tag)` in execution order.
    """

    def __init__(self) -> None:
        self.records: list[Collective] = []

    def __enter__(self) -> CommCounter:
        _COUNTERS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _COUNTERS.remove(self)

    def select(self, phase: str | None = None, tag: str | None = None, kind: str | None = None) -> list[Collective]:
        """Records matching every given field."""
        return [c for c in self.records if (phase is None or c.phase == phase) and (tag is None or c.tag == tag)
                and (kind is None or c.kind == kind)]

    def total_bytes(self, phase: str | None = None) -> int:
        return sum(c.bytes for c in self.select(phase=phase))

    def multiset(self) -> Counter:
        """Records as a multiset (order-free), for comparing with a prediction."""
        return Counter(self.records)


@contextmanager
def _phase(name: str) -> Iterator[None]:
    stack = _PHASES.__dict__.setdefault("stack", [])
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def recompute_phase() -> AbstractContextManager[None]:
    """Context in which collectives record phase "recompute": activation checkpointing re-running a
    forward. Pass it as the recompute context of torch.utils.checkpoint (see layers3d.checkpoint)."""
    return _phase("recompute")


def current_phase() -> str:
    """"recompute" inside `recompute_phase()`, else "backward" inside autograd's backward, else "forward"."""
    stack = getattr(_PHASES, "stack", None)
    if stack:
        return stack[-1]
    task_id = getattr(torch._C, "_current_graph_task_id", None)  # -1 outside autograd's backward
    return "backward" if task_id is not None and task_id() != -1 else "forward"


def _record(kind: str, axes: Sequence[str], nbytes: int, tag: str) -> None:
    if _COUNTERS:
        rec = Collective(kind, tuple(axes), int(nbytes), current_phase(), tag)
        for c in _COUNTERS:
            c.records.append(rec)


def _trivial(axes: Sequence[str], mesh: DeviceMesh) -> bool:
    """No axes, or a group of one rank: nothing to do and nothing recorded (as the cost model prices it)."""
    return not axes or mesh.size(axes) == 1


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# --- chunking helpers (shared with layers3d.shard) -------------------------------------------------
def split_chunks(t: torch.Tensor, dim: int, n: int, interleave: int = 1) -> list[torch.Tensor]:
    """Cut `t` into n equal blocks along `dim` (per segment when interleave > 1: block p is the p-th
    piece of every segment, concatenated)."""
    dim = dim % t.dim()
    if interleave == 1:
        _check_split(t, dim, n)
        return list(t.chunk(n, dim))
    if dim != t.dim() - 1:
        raise AssertionError("interleave applies to the last dim only")
    size = t.shape[dim]
    _check_split(t, dim, n * interleave)
    v = t.reshape(*t.shape[:-1], interleave, n, size // (interleave * n))  # (..., k, n, s)
    return [v.select(-2, p).reshape(*t.shape[:-1], size // n) for p in range(n)]


def cat_chunks(chunks: Sequence[torch.Tensor], dim: int, interleave: int = 1) -> torch.Tensor:
    """Inverse of `split_chunks`."""
    dim = dim % chunks[0].dim()
    if interleave == 1:
        return torch.cat(list(chunks), dim)
    if dim != chunks[0].dim() - 1:
        raise AssertionError("interleave applies to the last dim only")
    lead, size = chunks[0].shape[:-1], chunks[0].shape[-1]
    parts = [c.reshape(*lead, interleave, 1, size // interleave) for c in chunks]  # (..., k, 1, s)
    return torch.cat(parts, -2).reshape(*lead, size * len(chunks))


def _check_split(t: torch.Tensor, dim: int, n: int) -> None:
    if t.shape[dim] % n:
        raise AssertionError(f"dim {dim} of a tensor of shape {tuple(t.shape)} is not divisible by {n}")


# --- collectives -----------------------------------------------------------------------------------
def all_gather(t: torch.Tensor, dim: int, axes: Sequence[str], mesh: DeviceMesh, *, tag: str = "",
               interleave: int = 1) -> torch.Tensor:
    """Concatenate the local blocks of the group over `axes` along `dim`, in requested-axes order."""
    if _trivial(axes, mesh):
        return t
    order = mesh.order(axes)
    t = t.contiguous()
    bufs = [torch.empty_like(t) for _ in order]
    with tracked("all_gather", mesh.members(axes), tag):
        dist.all_gather(bufs, t, group=mesh.group(axes))
    out = cat_chunks([bufs[g] for g in order], dim, interleave)
    _record("all_gather", axes, _nbytes(out), tag)
    return out


def reduce_scatter(t: torch.Tensor, dim: int, axes: Sequence[str], mesh: DeviceMesh, *, tag: str = "",
                   interleave: int = 1) -> torch.Tensor:
    """Sum over the group and keep the block of this rank's position along `dim`."""
    if _trivial(axes, mesh):
        return t
    order = mesh.order(axes)
    chunks = split_chunks(t, dim, len(order), interleave)
    ins: list[torch.Tensor] = [t] * len(order)
    for p, g in enumerate(order):
        ins[g] = chunks[p].contiguous()
    out = torch.empty_like(ins[0])
    with tracked("reduce_scatter", mesh.members(axes), tag):
        dist.reduce_scatter(out, ins, group=mesh.group(axes))
    _record("reduce_scatter", axes, _nbytes(t), tag)
    return out


def all_reduce(t: torch.Tensor, axes: Sequence[str], mesh: DeviceMesh, *, tag: str = "",
               op: str = "sum") -> torch.Tensor:
    """Sum (or max) over the group; returns a new tensor, never changes `t`."""
    if _trivial(axes, mesh):
        return t
    out = t.clone(memory_format=torch.contiguous_format)
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
    with tracked("all_reduce", mesh.members(axes), tag):
        dist.all_reduce(out, op=reduce_op, group=mesh.group(axes))
    _record("all_reduce", axes, _nbytes(t), tag)
    return out


def all_to_all(t: torch.Tensor, gather_dim: int, scatter_dim: int, axes: Sequence[str], mesh: DeviceMesh, *,
               tag: str = "") -> torch.Tensor:
    """Cut `scatter_dim` into blocks, send block p to position p, and concatenate what arrives along
    `gather_dim` in position order."""
    if _trivial(axes, mesh):
        return t
    order = mesh.order(axes)
    chunks = split_chunks(t, scatter_dim, len(order))
    ins: list[torch.Tensor] = [t] * len(order)
    for p, g in enumerate(order):
        ins[g] = chunks[p].contiguous()
    outs = [torch.empty_like(ins[0]) for _ in order]
    with tracked("all_to_all", mesh.members(axes), tag):
        dist.all_to_all(outs, ins, group=mesh.group(axes))
    _record("all_to_all", axes, _nbytes(t), tag)
    return torch.cat([outs[g] for g in order], gather_dim)


def broadcast(t: torch.Tensor, axes: Sequence[str], mesh: DeviceMesh, *, src: int = 0, tag: str = "") -> torch.Tensor:
    """The tensor of the member at position `src` of the group over `axes`, on every member (`t` must
    have the right shape and dtype everywhere)."""
    if _trivial(axes, mesh):
        return t
    out = t.clone(memory_format=torch.contiguous_format)
    with tracked("broadcast", mesh.members(axes), tag):
        dist.broadcast(out, src=mesh.global_rank_at(axes, src), group=mesh.group(axes))
    _record("broadcast", axes, _nbytes(t), tag)
    return out
