"""Local blocks of global tensors: slicing a dense tensor to this rank's shard, gathering it back, and
seeding the initialisation of a shard that is built without the dense tensor.

A tensor's placement is given per dim as the ordered mesh axes splitting it (as `Layout.dims`); the rank's
block index along a dim is the mixed-radix number of its coordinates on those axes (first axis
outermost). `interleave=k` on `interleave_dim` cuts that dim per segment (fused q/k/v weights and outputs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import torch

from cost_models.layout import Layout
from cost_models.mesh import Mesh
from layers3d.comm import all_gather, split_chunks
from layers3d.errors import ShardingError
from layers3d.mesh import DeviceMesh

__all__ = [
    "block_index", "check_divisible", "local_block", "shard_tensor", "gather_tensor", "shard_generator",
    "ParamInit", "default_init", "init_shard",
]

Axes = tuple[str, ...]


def block_index(axes: Sequence[str], mesh: Mesh, rank: int) -> int:
    """Block index of `rank` along a dim split over `axes`."""
    coords = mesh.coords(rank)
    idx = 0
    for a in axes:
        idx = idx * mesh.axis_size(a) + coords[a]
    return idx


def check_divisible(size: int, axes: Sequence[str], mesh: Mesh, what: str, fix: str, segments: int = 1) -> None:
    """Raise ShardingError unless `size` splits evenly over `axes` (times `segments` interleaved segments)."""
    n = mesh.size(tuple(axes)) * segments
    if size % n:
        seg = f" in {segments} interleaved segments" if segments > 1 else ""
        raise ShardingError(
            f"{what} has size {size}, which cannot be split {mesh.size(tuple(axes))} ways{seg} over mesh axes "
            f"{tuple(axes)} of mesh {mesh}; {fix}"
        )


def local_block(full: torch.Tensor, dims: Sequence[Axes], mesh: Mesh, rank: int, *, interleave: int = 1,
                interleave_dim: int = -1) -> torch.Tensor:
    """The block of `full` that `rank` holds when dim d is split over dims[d], as a new tensor (never a
    view that would keep `full` alive)."""
    if len(dims) != full.dim():
        raise ShardingError(f"placement {tuple(dims)} has {len(dims)} dims but the tensor has shape {tuple(full.shape)}")
    out = full
    idim = interleave_dim % full.dim()
    for d, axes in enumerate(dims):
        if not axes:
            continue
        k = interleave if d == idim else 1
        check_divisible(full.shape[d], axes, mesh, f"dim {d} of a tensor of shape {tuple(full.shape)}",
                        "pad the tensor or pick axes whose sizes divide it", segments=k)
        if k > 1:
            out = out.movedim(d, -1)
            out = split_chunks(out, -1, mesh.size(axes), k)[block_index(axes, mesh, rank)].movedim(-1, d)
        else:
            out = out.chunk(mesh.size(axes), d)[block_index(axes, mesh, rank)]
    return out.clone(memory_format=torch.contiguous_format)


def shard_tensor(full: torch.Tensor, layout: Layout, mesh: Mesh, rank: int) -> torch.Tensor:
    """This rank's block of `full` under `layout` (a partial layout's value is taken as the whole sum)."""
    return local_block(full, layout.dims, mesh, rank, interleave=layout.interleave, interleave_dim=-1)


def gather_tensor(local: torch.Tensor, dims: Sequence[Axes], mesh: DeviceMesh, *, interleave: int = 1,
                  interleave_dim: int = -1, tag: str = "state") -> torch.Tensor:
    """Inverse of `local_block`: all-gather every split dim (one collective per dim, no autograd)."""
    out = local.detach()
    idim = interleave_dim % local.dim()
    for d, axes in enumerate(dims):
        if not axes:
            continue
        k = interleave if d == idim else 1
        if k > 1:
            out = all_gather(out.movedim(d, -1), -1, axes, mesh, tag=tag, interleave=k).movedim(-1, d)
        else:
            out = all_gather(out, d, axes, mesh, tag=tag)
    return out.contiguous()


def shard_generator(generator: torch.Generator | None, name: str, block: Sequence[int],
                    device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from `generator`'s initial seed, the parameter name and the block index, so that
    ranks holding the same block (replicas) initialise it identically and different blocks differ."""
    base = generator.initial_seed() if generator is not None else torch.initial_seed()
    digest = hashlib.sha256(f"{base}:{name}:{tuple(block)}".encode()).digest()
    if torch.device(device).type == "meta":  # a shard built on meta (to check a plan) draws nothing
        device = "cpu"
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g


ParamInit = Callable[[str, torch.Tensor, torch.Generator], None]


def default_init(name: str, local: torch.Tensor, generator: torch.Generator) -> None:
    """GPT-2 style: weights ~ N(0, 0.02), biases 0, norm scales ("norm_weight") 1."""
    with torch.no_grad():
        if name == "norm_weight":
            local.fill_(1.0)
        elif name.endswith("bias"):
            local.zero_()
        else:
            local.normal_(0.0, 0.02, generator=generator)


def init_shard(name: str, shape: Sequence[int], dims: Sequence[Axes], mesh: Mesh, rank: int, *,
               init_fn: ParamInit | None, generator: torch.Generator | None, dtype: torch.dtype,
               device: torch.device | str, init_name: str | None = None) -> torch.Tensor:
    """Allocate this rank's block (of the given local `shape`) of a parameter placed by `dims` and fill it
    with `init_fn(init_name or name, block, shard_generator(...))`, without the dense tensor."""
    local = torch.empty(tuple(shape), dtype=dtype, device=device)
    if local.is_meta:  # no values to fill (a plan checked on meta); on meta, normal_ runs torch's Python refs
        return local
    block = tuple(block_index(axes, mesh, rank) for axes in dims)
    (init_fn or default_init)(init_name or name, local, shard_generator(generator, name, block, local.device))
    return local
