"""Measure what a forward pass keeps for backward, and the peak memory of a step.

`SavedActivationMeter` is a context manager around a forward pass: through
`torch.autograd.graph.saved_tensors_hooks` it sees every tensor autograd saves and counts the bytes of the
*unique storages* behind them, so a tensor saved by several ops (the input that the q, k and v projections
share) counts once, and a view that spans part of a storage (a local slice of a replicated input) counts
only the part it spans. Parameters and buffers are model state, not activations: pass them as `exclude`.

Non-reentrant activation checkpointing saves nothing through the outer hooks (it installs its own); what a
checkpointed block keeps is its input, which the planner's checkpoint wrapper reports with
`note_kept(tensor)` while a meter is active. The result is comparable with the cost model's
`activation_bytes` (saved activations of the ops outside checkpointed blocks plus the inputs of the
checkpointed blocks).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType

import torch
from torch.autograd.graph import saved_tensors_hooks

from planner.apply.blocks import KEPT_OBSERVERS

__all__ = ["SavedActivationMeter", "note_kept", "storage_key", "cuda_peak_memory"]

_ACTIVE: list[SavedActivationMeter] = []


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    """Identity of the storage behind `t`: (device, address)."""
    return (str(t.device), t.untyped_storage().data_ptr())


def _span(t: torch.Tensor) -> tuple[int, int]:
    """Byte range [start, end) of the storage that tensor `t` can reach."""
    item = t.element_size()
    start = t.storage_offset() * item
    if t.numel() == 0:
        return start, start
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return start, start + (last + 1) * item


def _union_bytes(ranges: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for a, b in sorted(ranges):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


class SavedActivationMeter:
    """Counts the bytes autograd saves during the forward passes run inside the `with` block.

    exclude: tensors that are model state (parameters, buffers); their storages are never counted.
    After the block: `bytes` (unique storage bytes), `tensors` (number of save events) and `by_dtype`.
    Run only forward passes inside the block; the backward pass frees what is counted here.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._exclude = {storage_key(t) for t in exclude}
        self._ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self._dtype: dict[tuple[str, int], torch.dtype] = {}
        self._keep: list[torch.Tensor] = []  # holds the storages so an address is never reused meanwhile
        self.tensors = 0
        self._hooks = saved_tensors_hooks(self._pack, _unpack)

    @classmethod
    def for_module(cls, module: torch.nn.Module) -> SavedActivationMeter:
        """A meter that excludes `module`'s parameters and buffers."""
        return cls(list(module.parameters()) + list(module.buffers()))

    # --- hooks ---------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.record(t)
        return t

    def record(self, t: torch.Tensor) -> None:
        """Count `t` as kept for backward (once per storage byte)."""
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        key = storage_key(t)
        if key in self._exclude:
            return
        self.tensors += 1
        self._ranges.setdefault(key, []).append(_span(t))
        self._dtype.setdefault(key, t.dtype)
        self._keep.append(t)

    # --- results -------------------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        return sum(_union_bytes(r) for r in self._ranges.values())

    @property
    def by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, ranges in self._ranges.items():
            name = str(self._dtype[key]).removeprefix("torch.")
            out[name] = out.get(name, 0) + _union_bytes(ranges)
        return out

    # --- context -------------------------------------------------------------------------------
    def __enter__(self) -> SavedActivationMeter:
        self._hooks.__enter__()
        _ACTIVE.append(self)
        if len(_ACTIVE) == 1:
            KEPT_OBSERVERS.append(note_kept)
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        _ACTIVE.remove(self)
        if not _ACTIVE and note_kept in KEPT_OBSERVERS:
            KEPT_OBSERVERS.remove(note_kept)
        self._hooks.__exit__(et, ev, tb)
        self._keep.clear()


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def note_kept(tensors: Iterable[object]) -> None:
    """Tell the active meters (if any) that `tensors` are kept for backward outside autograd's saved
    tensors (the inputs a non-reentrant checkpoint holds for its recomputation)."""
    if not _ACTIVE:
        return
    for t in tensors:
        if isinstance(t, torch.Tensor):
            for m in _ACTIVE:
                m.record(t)


@contextmanager
def cuda_peak_memory(device: torch.device | None) -> Iterator[dict[str, int]]:
    """Peak bytes allocated on CUDA `device` inside the block, written to the yielded dict under "peak"
    (the bytes already allocated on entry under "start"). With `device` None (a CPU run) the dict stays
    empty: the CPU allocator keeps no such record."""
    result: dict[str, int] = {}
    if device is None or device.type != "cuda":
        yield result
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    result["start"] = torch.cuda.memory_allocated(device)
    try:
        yield result
    finally:
        torch.cuda.synchronize(device)
        result["peak"] = torch.cuda.max_memory_allocated(device)
