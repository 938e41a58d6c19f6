"""Layout conversion at run time: the steps of `cost_models.redistribution`, executed one to one.

`redistribute` runs `plan_redistribution(...)` in forward and `backward_steps(...)` in backward inside one
autograd function, so what the runtime moves is by construction what the cost model priced (tag "edge").
Gradients follow the complete-gradient convention of docs/ARCHITECTURE.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from cost_models.layout import Layout, LayoutError
from cost_models.mesh import Mesh
from cost_models.redistribution import Step, backward_steps, plan_redistribution
from layers3d.comm import all_gather, all_reduce, all_to_all, reduce_scatter, split_chunks
from layers3d.errors import ShardingError
from layers3d.mesh import DeviceMesh

__all__ = ["redistribute", "run_step", "redistribution_steps"]


def run_step(t: torch.Tensor, step: Step, mesh: DeviceMesh, tag: str = "edge") -> torch.Tensor:
    """Execute one `Step` on the local tensor `t` (whose layout is `step.before`)."""
    last = t.dim() - 1
    k = step.interleave if step.dim == last else 1
    if step.kind == "all_gather":
        return all_gather(t, step.dim, step.axes, mesh, tag=tag, interleave=k)
    if step.kind == "slice":
        # A copy, never a view: a view would keep the whole (often just gathered) tensor alive for as long
        # as the slice lives, e.g. saved for backward, where the cost model counts only the slice.
        return split_chunks(t, step.dim, mesh.size(step.axes), k)[mesh.group_rank(step.axes)].clone(
            memory_format=torch.contiguous_format)
    if step.kind == "reduce_scatter":
        return reduce_scatter(t, step.dim, step.axes, mesh, tag=tag, interleave=k)
    if step.kind == "all_reduce":
        return all_reduce(t, step.axes, mesh, tag=tag)
    if step.kind == "all_to_all":
        return all_to_all(t, step.dim, step.dst_dim, step.axes, mesh, tag=tag)
    raise AssertionError(f"unknown redistribution step {step.kind}")


@lru_cache(maxsize=4096)
def redistribution_steps(shape: tuple[int, ...], itemsize: int, src: Layout, dst: Layout,
                         mesh: Mesh) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """(forward steps, backward steps) converting a tensor of global `shape` from `src` to `dst`."""
    fwd = plan_redistribution(shape, itemsize, src, dst, mesh)
    return tuple(fwd), tuple(backward_steps(fwd, shape, itemsize, mesh))


class _Redistribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, fwd: tuple[Step, ...], bwd: tuple[Step, ...], mesh: DeviceMesh,
                tag: str) -> torch.Tensor:
        ctx.bwd, ctx.mesh, ctx.tag = bwd, mesh, tag
        for step in fwd:
            x = run_step(x, step, mesh, tag)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None]:
        for step in ctx.bwd:
            grad = run_step(grad, step, ctx.mesh, ctx.tag)
        return grad, None, None, None, None


def redistribute(x_local: torch.Tensor, src: Layout, dst: Layout, mesh: DeviceMesh, shape: Sequence[int], *,
                 tag: str = "edge") -> torch.Tensor:
    """Convert this rank's block of a tensor of global `shape` from layout `src` to layout `dst`.

    Runs the collectives of `plan_redistribution` (forward) and `backward_steps` (backward); returns
    `x_local` itself when the layouts are equal.
    """
    shape = tuple(int(s) for s in shape)
    try:
        expected = src.local_shape(shape, mesh.mesh)
        fwd, bwd = redistribution_steps(shape, x_local.element_size(), src, dst, mesh.mesh)
    except LayoutError as e:
        raise ShardingError(f"cannot redistribute a tensor of shape {shape} from {src} to {dst}: {e}") from None
    if tuple(x_local.shape) != expected:
        raise ShardingError(
            f"local tensor of shape {tuple(x_local.shape)} is not the {src} block {expected} of a tensor of "
            f"global shape {shape} on mesh {mesh.mesh}; pass the global shape of the tensor"
        )
    if not fwd:
        return x_local
    return _Redistribute.apply(x_local, fwd, bwd, mesh, tag)
