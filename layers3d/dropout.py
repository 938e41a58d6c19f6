"""Dropout on a sharded tensor with Megatron's model-parallel RNG rule.

Ranks that hold the same elements of a tensor must drop the same elements (their copies stay equal);
ranks that hold different elements must draw independent masks (else every shard repeats one pattern).
`ParallelDropout` seeds a generator per call from (a draw of the global RNG, the op's key, this rank's
coordinates on the axes that split the tensor): the global draw is the same on every rank seeded alike,
so only the coordinates tell ranks apart, and only where they hold different elements. The draw comes
from the global CPU generator, which `torch.utils.checkpoint` saves and restores, so a recomputed
forward draws the same mask.

The mask is saved for backward as `mask_dtype` (bool: 1 byte per element as CUDA's fused dropout; or
the input's dtype as the CPU kernel), the bytes the cost model prices (`cost_models.memory`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch
import torch.nn as nn

from cost_models.memory import dropout_mask_itemsize
from layers3d.builders import LayerRequest, builds
from layers3d.mesh import DeviceMesh

__all__ = ["ParallelDropout"]

_MIX = 0x9E3779B97F4A7C15  # 64-bit golden-ratio constant: spreads the seed's parts over the bits


class ParallelDropout(nn.Module):
    """Dropout with probability `p` of a tensor whose dims are split over `split_axes` (all of them,
    in any dim); `key` names the op (the same on every rank)."""

    def __init__(self, p: float, mesh: DeviceMesh, split_axes: Sequence[str], key: str,
                 mask_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p, self.mesh, self.key = p, mesh, key
        self.split_axes = tuple(split_axes)
        self.mask_dtype = mask_dtype
        coords = tuple(mesh.group_rank((ax,)) for ax in self.split_axes)
        self._salt = zlib.crc32(repr((key, self.split_axes, coords)).encode())
        self.last_mask: torch.Tensor | None = None  # kept only when `record` is set (verify's check)
        self.record = False

    def _generator(self, device: torch.device) -> torch.Generator:
        draw = int(torch.randint(0, 2**62, (1,)).item())  # global CPU RNG: equal on ranks, replayed by checkpoint
        seed = (draw ^ (self._salt * _MIX)) & (2**63 - 1)
        return torch.Generator(device=device).manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        gen = self._generator(x.device)
        keep = torch.empty(x.shape, device=x.device).bernoulli_(1.0 - self.p, generator=gen)  # (*local shape)
        mask = keep.to(self.mask_dtype or x.dtype)
        if self.record:
            self.last_mask = mask.detach().to(torch.bool)
        return x * mask / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}, split={''.join(self.split_axes) or '-'}, key={self.key!r}"


@builds("dropout")
def build_dropout(req: LayerRequest) -> nn.Module | None:
    """Dropout p > 0 in training: a `ParallelDropout` seeded from the axes that split its input (the same
    mask where ranks hold the same elements, independent ones elsewhere); its mask is saved in the dtype
    the cost model prices for this device kind."""
    op = req.op
    p = float(op.attrs.get("p", 0.5))
    if p <= 0 or not op.attrs.get("training", op.attrs.get("train", True)):
        return None  # the identity: run as traced
    lay = req.inputs[0] if req.inputs else None
    split = tuple(ax for d in lay.dims for ax in d) if lay is not None else ()
    x = op.input_meta[0]
    kind = "cpu" if req.device.type == "meta" else req.device.type  # a meta build only checks the plan builds
    item = dropout_mask_itemsize(x.dtype, kind)
    mask_dtype = torch.bool if item == 1 else getattr(torch, x.dtype)
    return ParallelDropout(p, req.mesh, split, op.name, mask_dtype)
