"""Small helpers shared by the layers3d tests."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from cost_models.strategy import Collective

__all__ = ["SavedBytes", "rel_err", "with_recompute"]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (fp32 equality up to round-off is <= 1e-5 here)."""
    return float((a - b).detach().double().norm() / b.detach().double().norm().clamp_min(1e-30))


def with_recompute(collectives: list[Collective]) -> list[Collective]:
    """The collectives of a checkpointed op: its own, plus every forward one again as "recompute"."""
    return list(collectives) + [Collective(c.kind, c.axes, c.bytes, "recompute", c.tag)
                                for c in collectives if c.phase == "forward"]


class SavedBytes(torch.autograd.graph.saved_tensors_hooks):
    """Bytes autograd keeps for backward while active: unique tensors (by address and size; the same
    tensor saved twice counts once), parameters and views of them excluded (model states)."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._skip = {p.untyped_storage().data_ptr() for p in exclude}
        self._seen: dict[tuple, int] = {}
        super().__init__(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in self._skip:
            self._seen[(t.data_ptr(), t.numel(), t.dtype)] = t.numel() * t.element_size()
        return t

    def __enter__(self) -> SavedBytes:
        super().__enter__()
        return self

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())
