"""ParallelEmbedding: y = W[ids] with W: [V, H] split by scheme.

| scheme    | W stored              | ids / y                          | forward                      | backward            |
|-----------|-----------------------|----------------------------------|------------------------------|---------------------|
| replicate | full                  | tok/(dp) -> tok/(dp), H          | -                            | AR dW over dp       |
| fsdp      | V/dp (H/dp if V does not divide) | tok/(dp) -> tok/(dp), H | AG W over dp (weight)        | RS dW over dp       |
| vocab (T) | V/T                   | tok/(dp) -> tok/(dp), H          | AR y over T (output)         | AR dW over dp       |
| vocab sp  | V/T                   | tok/(dp) -> tok/(dp), seq/T, H   | RS y over T onto seq (output)| AG dY over T, AR dW |
| hidden (T)| H/T                   | tok/(dp) -> tok/(dp), H/T        | -                            | AR dW over dp       |

"1d_col" is accepted as another name for "hidden" (the cost model's). A vocab-parallel rank looks up
the ids in its range [lo, hi) and writes zeros for the others; the all-reduce (or reduce-scatter) over
T completes the rows. dp defaults to the mesh axes the scheme does not use (every axis for replicate /
fsdp).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

from cost_models.layout import Layout
from layers3d.builders import LayerRequest, StoredPlacement, builds
from layers3d.data_parallel import gather_param, reduce_grad
from layers3d.errors import LayerBuildError, ShardingError
from layers3d.functional import reduce_output, reduce_scatter_output
from layers3d.mesh import DeviceMesh
from layers3d.shard import ParamInit, check_divisible, gather_tensor, init_shard, local_block
from layers3d.tokens import token_dims

__all__ = ["EMBEDDING_SCHEMES", "ParallelEmbedding", "build_embedding"]

Axes = tuple[str, ...]
EMBEDDING_SCHEMES = ("replicate", "fsdp", "vocab", "hidden", "1d_col")  # "1d_col": the cost model's name for hidden


class _VocabLookup(torch.autograd.Function):
    """Rows [lo, lo + rows) of the table: W[ids - lo] where ids fall in the range, 0 elsewhere. Saves only
    the ids (as an embedding does); the range mask is recomputed in backward."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, w: torch.Tensor, lo: int, padding_idx: int | None) -> torch.Tensor:
        inside = (ids >= lo) & (ids < lo + w.shape[0])
        y = F.embedding(torch.where(inside, ids - lo, torch.zeros_like(ids)), w)    # (*tok, H)
        ctx.lo, ctx.padding_idx, ctx.rows = lo, padding_idx, w.shape[0]
        ctx.save_for_backward(ids)
        return y.masked_fill_(~inside[..., None], 0.0)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[None, torch.Tensor, None, None]:
        (ids,) = ctx.saved_tensors
        keep = (ids >= ctx.lo) & (ids < ctx.lo + ctx.rows)
        if ctx.padding_idx is not None:
            keep &= ids != ctx.padding_idx
        dw = dy.new_zeros(ctx.rows, dy.shape[-1])
        dw.index_add_(0, (ids[keep] - ctx.lo), dy[keep])
        return None, dw, None, None


class ParallelEmbedding(nn.Module):
    """An embedding table split over a device mesh (see the module docstring).

    axes: T for "vocab" / "hidden" (empty otherwise); dp: token axes (default: the other mesh axes);
    sp: vocab only: reduce-scatter the output onto the sequence dim instead of all-reducing it.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, mesh: DeviceMesh, scheme: str = "replicate", *,
                 axes: Sequence[str] = (), dp: Sequence[str] | None = None, sp: bool = False,
                 padding_idx: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", init_fn: ParamInit | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if scheme not in EMBEDDING_SCHEMES:
            raise ShardingError(f"unknown embedding scheme {scheme!r}; choose one of {EMBEDDING_SCHEMES}")
        scheme = "hidden" if scheme == "1d_col" else scheme
        axes = tuple(axes)
        if (scheme in ("vocab", "hidden")) != bool(axes):
            need = "one or more" if scheme in ("vocab", "hidden") else "no"
            raise ShardingError(f"embedding scheme {scheme} takes {need} tensor-parallel axes, got axes={axes}")
        if sp and scheme != "vocab":
            raise ShardingError("sp (reduce-scatter onto the sequence dim) applies to the vocab scheme only")
        self.dp = tuple(a for a in mesh.axis_names if a not in axes) if dp is None else tuple(dp)
        if len(set(axes + self.dp)) != len(axes + self.dp) or any(a not in mesh.axis_names for a in axes + self.dp):
            raise ShardingError(f"embedding axes {axes} and dp {self.dp} must be distinct axes of mesh {mesh.mesh}")
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.mesh, self.scheme, self.axes, self.sp = mesh, scheme, axes, sp
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        fix = "choose sizes divisible by the split, or another scheme or mesh"
        if scheme == "fsdp":
            self.weight_dims: tuple[Axes, Axes] = (self.dp, ()) if num_embeddings % mesh.size(self.dp) == 0 \
                else ((), self.dp)
        else:
            self.weight_dims = {"replicate": ((), ()), "vocab": (axes, ()), "hidden": ((), axes)}[scheme]
        check_divisible(num_embeddings, self.weight_dims[0], mesh.mesh, f"{scheme} embedding vocabulary", fix)
        check_divisible(embedding_dim, self.weight_dims[1], mesh.mesh, f"{scheme} embedding dim", fix)
        local = (num_embeddings // mesh.size(self.weight_dims[0]), embedding_dim // mesh.size(self.weight_dims[1]))
        self.weight = nn.Parameter(init_shard("weight", local, self.weight_dims, mesh.mesh, mesh.rank, init_fn=init_fn,
                                              generator=generator, dtype=dtype, device=device))

    @classmethod
    def from_dense(cls, dense: nn.Embedding, mesh: DeviceMesh, scheme: str = "replicate", *,
                   axes: Sequence[str] = (), dp: Sequence[str] | None = None, sp: bool = False,
                   init_fn: ParamInit | None = None, generator: torch.Generator | None = None,
                   device: torch.device | str | None = None) -> ParallelEmbedding:
        """Shard an nn.Embedding (a meta-device one is initialised shard by shard, see ParallelLinear)."""
        w = dense.weight
        meta = w.device.type == "meta"
        out = cls(dense.num_embeddings, dense.embedding_dim, mesh, scheme, axes=axes, dp=dp, sp=sp,
                  padding_idx=dense.padding_idx, dtype=w.dtype, device=device or ("cpu" if meta else w.device),
                  init_fn=init_fn, generator=generator)
        if not meta:
            with torch.no_grad():
                out.weight.copy_(local_block(w.detach(), out.weight_dims, mesh.mesh, mesh.rank))
        return out

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        """The full table (collective), key as nn.Embedding's."""
        return {"weight": gather_tensor(self.weight, self.weight_dims, self.mesh)}

    def stored_placement(self, attr: str) -> StoredPlacement:
        """How the table is stored (its only parameter)."""
        return StoredPlacement(tuple(self.weight_dims))

    # --- layouts ---------------------------------------------------------------------------------
    @property
    def token_axes(self) -> Axes:
        return self.dp

    def ids_layout(self, shape: Sequence[int]) -> Layout:
        """Layout of the ids of global shape [*tokens]."""
        return Layout(token_dims(shape, self.dp, (), self.mesh.mesh, "embedding ids"))

    def output_layout(self, shape: Sequence[int]) -> Layout:
        """Layout of the output of global shape [*tokens, H]."""
        seq = self.axes if self.sp else ()
        feat = self.axes if self.scheme == "hidden" else ()
        return Layout(token_dims(shape[:-1], self.dp, seq, self.mesh.mesh, "embedding output") + (feat,))

    # --- forward ---------------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (*tokens_local) integer tensor -> (*tokens_local', H_local)."""
        m, w = self.mesh, self.weight
        if self.scheme == "fsdp":
            dim = 0 if self.weight_dims[0] else 1
            return F.embedding(ids, gather_param(w, dim, self.dp, m), self.padding_idx)
        w = reduce_grad(w, self.dp, m)
        if self.scheme in ("replicate", "hidden"):
            return F.embedding(ids, w, self.padding_idx)
        # vocab-parallel: look up the rows in [lo, hi), zeros elsewhere, then sum over T.
        y = _VocabLookup.apply(ids, w, m.group_rank(self.axes) * w.shape[0], self.padding_idx)  # partial over T
        if self.sp:
            if ids.dim() < 1:
                raise ShardingError("a sequence-parallel embedding needs ids with a sequence dim")
            return reduce_scatter_output(y, ids.dim() - 1, self.axes, m)
        return reduce_output(y, self.axes, m)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, scheme={self.scheme}, axes={self.axes}, "
                f"dp={self.dp}, sp={self.sp}")


# The cost model's scheme names -> this layer's.
_PLANNED_SCHEMES = {"replicate": "replicate", "fsdp": "fsdp", "vocab": "vocab", "1d_col": "hidden"}


@builds("embedding")
def build_embedding(req: LayerRequest) -> ParallelEmbedding:
    """A planned embedding: options T (the tensor-parallel axes), dp and sp as the cost model wrote them."""
    w = req.param("weight")
    if w is None or req.scheme not in _PLANNED_SCHEMES:
        raise LayerBuildError(f"embedding op {req.op.name}: scheme {req.scheme!r} is not one the runtime implements")
    V, H = w.shape
    dense = SimpleNamespace(weight=w, num_embeddings=V, embedding_dim=H, padding_idx=req.op.attrs.get("padding_idx"))
    return ParallelEmbedding.from_dense(dense, req.mesh, _PLANNED_SCHEMES[req.scheme], axes=req.option("T", ()),
                                        dp=req.option("dp"), sp=bool(req.option("sp", False)),
                                        generator=req.generator, device=req.device)
