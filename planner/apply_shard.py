"""Dense tensors <-> this rank's block of a `Layout`, without collectives except in `gather_full`.

A layout splits each tensor dim over an ordered tuple of mesh axes: the rank's block index along that dim
is the mixed-radix number of its coordinates on those axes (first axis outermost), the block size is the
dim over the product of the axis sizes. With `interleave = k` the last dim is k equal segments, each split
on its own, and the rank's block of the last dim is its block of every segment, side by side. This is the
convention of `cost_models.layout` and of `layers3d`; here it is applied to whole tensors so that dense
weights can be sharded and shards put back together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from cost_models.layout import Layout, LayoutError
from cost_models.mesh import Mesh

__all__ = ["block_index", "local_block", "assemble_blocks", "gather_full", "ShardError"]


class ShardError(ValueError):
    """A tensor whose shape does not match the layout it should be split or assembled with."""


def block_index(layout: Layout, dim: int, mesh: Mesh, coords: Mapping[str, int]) -> tuple[int, int]:
    """(index, count) of the block a rank at `coords` holds along tensor dim `dim`."""
    idx, count = 0, 1
    for a in layout.dims[dim]:
        size = mesh.axis_size(a)
        idx = idx * size + coords[a]
        count *= size
    return idx, count


def _segments(layout: Layout, dim: int) -> int:
    return layout.interleave if dim == layout.ndim - 1 and layout.dims[dim] else 1


def local_block(full: torch.Tensor, layout: Layout, mesh: Mesh, coords: Mapping[str, int]) -> torch.Tensor:
    """The block of `full` (a dense tensor, or its global shape on the meta device) that the rank at
    `coords` holds under `layout`, as a new contiguous tensor. Partial-sum axes are ignored (a dense
    tensor is complete)."""
    try:
        layout.local_shape(tuple(full.shape), mesh)
    except LayoutError as e:
        raise ShardError(f"cannot split a tensor of shape {tuple(full.shape)}: {e}") from None
    out = full
    for d in range(layout.ndim):
        idx, count = block_index(layout, d, mesh, coords)
        if count == 1:
            continue
        seg = _segments(layout, d)
        seg_len = out.shape[d] // seg
        size = seg_len // count
        parts = [out.narrow(d, s * seg_len + idx * size, size) for s in range(seg)]
        out = parts[0] if seg == 1 else torch.cat(parts, dim=d)
    return out.contiguous() if out.device.type != "meta" else torch.empty_like(out)


def assemble_blocks(blocks: Sequence[torch.Tensor], layout: Layout, mesh: Mesh,
                    shape: Sequence[int]) -> torch.Tensor:
    """Inverse of `local_block`: the dense tensor of global `shape` from `blocks[r]`, the block of
    global rank r, for every rank of the mesh (replicas must agree; the first one seen is used)."""
    shape = tuple(shape)
    if len(blocks) != mesh.world_size:
        raise ShardError(f"{len(blocks)} blocks for a mesh of {mesh.world_size} ranks")
    want = layout.local_shape(shape, mesh)
    out = blocks[0].new_empty(shape)
    for rank, block in enumerate(blocks):
        if tuple(block.shape) != want:
            raise ShardError(f"block of rank {rank} has shape {tuple(block.shape)}, layout {layout} of a "
                             f"tensor of shape {shape} gives {want}")
        coords = mesh.coords(rank)
        view = out
        src = block
        # Walk the dims, narrowing `view` to this rank's region; interleaved segments are copied one by one.
        regions: list[tuple[torch.Tensor, torch.Tensor]] = [(view, src)]
        for d in range(layout.ndim):
            idx, count = block_index(layout, d, mesh, coords)
            if count == 1:
                continue
            seg = _segments(layout, d)
            nxt = []
            for v, s in regions:
                seg_len = v.shape[d] // seg
                size = seg_len // count
                for k in range(seg):
                    nxt.append((v.narrow(d, k * seg_len + idx * size, size), s.narrow(d, k * size, size)))
            regions = nxt
        for v, s in regions:
            v.copy_(s)
    return out


def gather_full(local: torch.Tensor, layout: Layout, mesh: Mesh, shape: Sequence[int],
                group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The dense tensor on every rank from each rank's `local` block (a collective over the world:
    every rank must call it with blocks of the same shape). Meant for checkpoints and checks, not for
    the training step: it moves the whole tensor to every rank."""
    if layout.partial:
        raise ShardError(f"layout {layout} holds pending partial sums; reduce them before gathering")
    local = local.detach().contiguous()
    blocks = [torch.empty_like(local) for _ in range(mesh.world_size)]
    dist.all_gather(blocks, local, group=group)
    return assemble_blocks(blocks, layout, mesh, shape)
