"""Activation-side autograd collectives (Megatron's f/g operators, sequence-parallel variants).

Each follows the complete-gradient convention of docs/ARCHITECTURE.md: the input of `reduce_output` is a
partial sum whose summed value is replicated over `axes`, so its gradient is the (complete) output
gradient as is; `reduce_scatter_output` scatters the sum along a dim and gathers the gradient back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from layers3d.comm import all_gather, all_reduce, reduce_scatter
from layers3d.data_parallel import reduce_grad
from layers3d.mesh import DeviceMesh

__all__ = ["reduce_output", "reduce_scatter_output", "GradReduce", "OutputReduce"]

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


class GradReduce(nn.Module):
    """Identity forward; all-reduces the gradient over `axes` (an input broadcast over split dims)."""

    def __init__(self, axes: Sequence[str], mesh: DeviceMesh) -> None:
        super().__init__()
        self.axes, self.mesh = tuple(axes), mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.requires_grad:
            return x
        return reduce_grad(x, self.axes, self.mesh, "grad_input")

    def extra_repr(self) -> str:
        return f"axes={self.axes}"


class OutputReduce(nn.Module):
    """All-reduces a reduction's partial result over `axes` (tag output); `scale` divides it afterwards
    (a mean over a split dim is the mean of the local means)."""

    def __init__(self, axes: Sequence[str], mesh: DeviceMesh, scale: float = 1.0) -> None:
        super().__init__()
        self.axes, self.mesh, self.scale = tuple(axes), mesh, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_output(x, self.axes, self.mesh)
        return y / self.scale if self.scale != 1.0 else y

    def extra_repr(self) -> str:
        return f"axes={self.axes}, scale={self.scale}"
