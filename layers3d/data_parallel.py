"""Parameter-side autograd helpers: gradient reduction over data-parallel axes and FSDP gathering.

`reduce_grad(p, axes)` is the identity in forward and all-reduces the gradient over `axes` in backward
(tag grad_weight, or the given tag): use it on a parameter whose gradient is partial over the axes that
split the tokens. `gather_param(p, dim, axes)` all-gathers a sharded parameter before use (tag weight)
and reduce-scatters its gradient (tag grad_weight): ZeRO-3 / FSDP for one tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from layers3d.comm import all_gather, all_reduce, reduce_scatter
from layers3d.mesh import DeviceMesh

__all__ = ["reduce_grad", "gather_param"]

Axes = tuple[str, ...]


class _ReduceGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p: torch.Tensor, axes: Axes, mesh: DeviceMesh, tag: str) -> torch.Tensor:
        ctx.axes, ctx.mesh, ctx.tag = axes, mesh, tag
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return all_reduce(grad, ctx.axes, ctx.mesh, tag=ctx.tag), None, None, None


class _GatherParam(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p: torch.Tensor, dim: int, axes: Axes, mesh: DeviceMesh) -> torch.Tensor:
        ctx.dim, ctx.axes, ctx.mesh = dim, axes, mesh
        return all_gather(p, dim, axes, mesh, tag="weight")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return reduce_scatter(grad, ctx.dim, ctx.axes, ctx.mesh, tag="grad_weight"), None, None, None


def reduce_grad(p: torch.Tensor, axes: Sequence[str], mesh: DeviceMesh, tag: str = "grad_weight") -> torch.Tensor:
    """Identity whose backward all-reduces the gradient over `axes` (no-op for no axes)."""
    axes = tuple(axes)
    if not axes or mesh.size(axes) == 1:
        return p
    return _ReduceGrad.apply(p, axes, mesh, tag)


def gather_param(p: torch.Tensor, dim: int, axes: Sequence[str], mesh: DeviceMesh) -> torch.Tensor:
    """The full parameter from its shards along `dim` over `axes`; the gradient is reduce-scattered back."""
    axes = tuple(axes)
    if not axes or mesh.size(axes) == 1:
        return p
    return _GatherParam.apply(p, dim, axes, mesh)
