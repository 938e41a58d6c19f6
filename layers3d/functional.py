"""Activation-side autograd collectives (Megatron's f/g operators, sequence-parallel variants).

Each follows the complete-gradient convention of docs/ARCHITECTURE.md: the input of `reduce_output` is a
partial sum whose summed value is replicated over `axes`, so its gradient is the (complete) output
gradient as is; `reduce_scatter_output` scatters the sum along a dim and gathers the gradient back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from layers3d.comm import all_gather, all_reduce, reduce_scatter
from layers3d.mesh import DeviceMesh

__all__ = ["reduce_output", "reduce_scatter_output"]

Axes = tuple[str, ...]


class _ReduceOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, axes: Axes, mesh: DeviceMesh, tag: str) -> torch.Tensor:
        return all_reduce(x, axes, mesh, tag=tag)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return grad, None, None, None


class _ReduceScatterOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, axes: Axes, mesh: DeviceMesh, tag: str) -> torch.Tensor:
        ctx.dim, ctx.axes, ctx.mesh = dim, axes, mesh
        return reduce_scatter(x, dim, axes, mesh, tag=tag)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        return all_gather(grad, ctx.dim, ctx.axes, ctx.mesh, tag="grad_output"), None, None, None, None


def reduce_output(x: torch.Tensor, axes: Sequence[str], mesh: DeviceMesh, tag: str = "output") -> torch.Tensor:
    """All-reduce a partial sum over `axes` (forward); pass the gradient through (backward)."""
    axes = tuple(axes)
    if not axes or mesh.size(axes) == 1:
        return x
    return _ReduceOutput.apply(x, axes, mesh, tag)


def reduce_scatter_output(x: torch.Tensor, dim: int, axes: Sequence[str], mesh: DeviceMesh,
                          tag: str = "output") -> torch.Tensor:
    """Reduce-scatter a partial sum along `dim` over `axes`; all-gather the gradient (tag grad_output)."""
    axes = tuple(axes)
    if not axes or mesh.size(axes) == 1:
        return x
    return _ReduceScatterOutput.apply(x, dim, axes, mesh, tag)
