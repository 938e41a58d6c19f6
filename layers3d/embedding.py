"""ParallelEmbedding: y = W[ids] with W: [V, H] split by an embedding scheme.

The scheme is a value defined in `cost_models.embedding_scheme` (replicate, fsdp, vocab, 1d_col; "hidden"
is accepted as another name for 1d_col): `embedding_plan` gives its layouts, `embedding_steps` the
collectives between them, and this module executes those steps around a local lookup
(`layers3d.redistribute.run_step`, as edges do), so what runs is what was priced; there is no per-scheme
branch here. A rank holding a range of W's rows looks up the ids in its range [lo, hi) and writes zeros
for the others (the reduction over the vocabulary axes completes the rows). The backward saves the ids only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

from cost_models.embedding_scheme import (
    EMBEDDING_SCHEME_NAMES,
    EmbeddingPlan,
    EmbeddingSchemeError,
    EmbeddingSteps,
    embedding_plan,
    embedding_steps,
)
from cost_models.layout import Layout
from cost_models.redistribution import Step
from cost_models.schemes import Scheme
from layers3d.builders import LayerRequest, StoredPlacement, builds
from layers3d.errors import LayerBuildError, ShardingError
from layers3d.mesh import DeviceMesh
from layers3d.redistribute import run_step
from layers3d.shard import ParamInit, gather_tensor, init_shard, local_block

__all__ = ["EMBEDDING_SCHEMES", "ParallelEmbedding", "build_embedding"]

Axes = tuple[str, ...]
EMBEDDING_SCHEMES = (*EMBEDDING_SCHEME_NAMES, "hidden")  # "hidden": another name for 1d_col


@dataclass(frozen=True)
class _Call:
    """The steps of one plan resolved for one ids shape."""

    mesh: DeviceMesh
    steps: EmbeddingSteps
    lo: int                 # first row of W this rank's lookup holds
    rows: int               # rows it holds
    padding_idx: int | None


def _run(t: torch.Tensor, steps: Sequence[Step], mesh: DeviceMesh, tag: str) -> torch.Tensor:
    for s in steps:
        t = run_step(t, s, mesh, tag)
    return t


class _EmbeddingFn(torch.autograd.Function):
    """W_store -> W_eff, the lookup of the rows in [lo, lo + rows), y_eff -> y_out; the backward runs the
    priced steps back (dY, then dW reduce-scattered and all-reduced into W's stored layout)."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, w: torch.Tensor, call: _Call) -> torch.Tensor:
        st, m = call.steps, call.mesh
        wg = _run(w, st.w_fwd, m, "weight")
        inside = (ids >= call.lo) & (ids < call.lo + call.rows)
        y = F.embedding(torch.where(inside, ids - call.lo, torch.zeros_like(ids)), wg)   # (*tok, H_eff)
        y = y.masked_fill_(~inside[..., None], 0.0)
        ctx.call, ctx.w_eff_shape = call, wg.shape
        ctx.save_for_backward(ids)
        return _run(y, st.y_fwd, m, "output")

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[None, torch.Tensor | None, None]:
        call: _Call = ctx.call
        st, m = call.steps, call.mesh
        if not ctx.needs_input_grad[1]:
            return None, None, None
        (ids,) = ctx.saved_tensors
        dyg = _run(dy, st.dy, m, "grad_output")
        keep = (ids >= call.lo) & (ids < call.lo + call.rows)
        if call.padding_idx is not None:
            keep &= ids != call.padding_idx
        dw = dyg.new_zeros(ctx.w_eff_shape)
        dw.index_add_(0, ids[keep] - call.lo, dyg[keep])
        dw = _run(dw, st.dw_scatter, m, "grad_weight")
        return None, _run(dw, st.dw_reduce, m, "grad_weight"), None


class ParallelEmbedding(nn.Module):
    """An embedding table split over a device mesh (see the module docstring).

    axes: T for "vocab" / "hidden" (empty otherwise); dp: token axes (default: the other mesh axes);
    sp: vocab only: reduce-scatter the output onto the sequence dim instead of all-reducing it.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, mesh: DeviceMesh, scheme: str = "replicate", *,
                 axes: Sequence[str] = (), dp: Sequence[str] | None = None, sp: bool = False,
                 shard_dim: int | None = None, token_shape: Sequence[int] | None = None,
                 padding_idx: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", init_fn: ParamInit | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if scheme not in EMBEDDING_SCHEMES:
            raise ShardingError(f"unknown embedding scheme {scheme!r}; choose one of {EMBEDDING_SCHEMES}")
        self.scheme = Scheme.ONE_D_COL.value if scheme == "hidden" else scheme
        self.axes = tuple(axes)
        self.dp = tuple(a for a in mesh.axis_names if a not in self.axes) if dp is None else tuple(dp)
        self.options = {"T": self.axes or None, "dp": self.dp, "sp": sp if self.scheme == Scheme.VOCAB else None,
                        "shard_dim": shard_dim}
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.mesh, self.sp = mesh, sp
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.token_shape = tuple(token_shape) if token_shape is not None else None
        self._by_shape: dict[tuple, _Call] = {}
        # W's placement does not depend on the tokens: take it from tokens every split divides.
        self.plan = self.plan_for((mesh.mesh.world_size ** 2,))
        local = (num_embeddings // mesh.size(self.weight_dims[0]), embedding_dim // mesh.size(self.weight_dims[1]))
        self.weight = nn.Parameter(init_shard("weight", local, self.weight_dims, mesh.mesh, mesh.rank, init_fn=init_fn,
                                              generator=generator, dtype=dtype, device=device))

    def plan_for(self, ids_shape: Sequence[int]) -> EmbeddingPlan:
        """The scheme's layouts for ids of global shape `ids_shape`."""
        try:
            return embedding_plan(self.scheme, self.options, ids_shape, self.num_embeddings, self.embedding_dim,
                                  self.mesh.mesh)
        except EmbeddingSchemeError as e:
            raise ShardingError(f"embedding {self.num_embeddings}x{self.embedding_dim} on mesh {self.mesh.mesh}: {e}; "
                                "choose sizes divisible by the split, or another scheme or mesh") from None

    @property
    def weight_dims(self) -> tuple[Axes, Axes]:
        """Axes splitting each dim of the stored table."""
        return self.plan.w_store.dims  # type: ignore[return-value]

    @classmethod
    def from_dense(cls, dense: nn.Embedding, mesh: DeviceMesh, scheme: str = "replicate", *,
                   axes: Sequence[str] = (), dp: Sequence[str] | None = None, sp: bool = False,
                   shard_dim: int | None = None, token_shape: Sequence[int] | None = None,
                   init_fn: ParamInit | None = None, generator: torch.Generator | None = None,
                   device: torch.device | str | None = None) -> ParallelEmbedding:
        """Shard an nn.Embedding (a meta-device one is initialised shard by shard, see ParallelLinear)."""
        w = dense.weight
        meta = w.device.type == "meta"
        out = cls(dense.num_embeddings, dense.embedding_dim, mesh, scheme, axes=axes, dp=dp, sp=sp,
                  shard_dim=shard_dim, token_shape=token_shape, padding_idx=dense.padding_idx, dtype=w.dtype, device=device or ("cpu" if meta else w.device),
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
        return self.plan_for(shape).ids

    def output_layout(self, shape: Sequence[int]) -> Layout:
        """Layout of the output of global shape [*tokens, H]."""
        return self.plan_for(tuple(shape[:-1])).y_out

    # --- forward ---------------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (*tokens_local) integer tensor -> (*tokens_local', H_local)."""
        key = (tuple(ids.shape), self.token_shape)
        call = self._by_shape.get(key)
        if call is None:
            call = self._by_shape[key] = self._resolve(ids)
        return _EmbeddingFn.apply(ids, self.weight, call)

    def _global_shape(self, ids: torch.Tensor) -> tuple[int, ...]:
        if self.token_shape is not None:
            return self.token_shape
        # Every token split on the batch dim first: the layout of tokens every split divides.
        nominal = self.plan_for((self.mesh.mesh.world_size ** 2,) * ids.dim()).ids
        return tuple(s * self.mesh.size(d) for s, d in zip(ids.shape, nominal.dims))

    def _resolve(self, ids: torch.Tensor) -> _Call:
        if ids.dim() < 1:
            raise ShardingError(f"ParallelEmbedding needs ids with at least one token dim, got shape {tuple(ids.shape)}")
        shape = self._global_shape(ids)
        plan = self.plan_for(shape)
        want = plan.ids.local_shape(shape, self.mesh.mesh)
        if tuple(ids.shape) != want:
            raise ShardingError(f"{self.scheme} embedding expects its ids in layout {plan.ids} of global shape {shape}, "
                                f"i.e. local shape {want}, got {tuple(ids.shape)}; pass token_shape= the global "
                                "(batch, sequence) sizes")
        w = self.weight
        steps = embedding_steps(plan, shape, self.num_embeddings, self.embedding_dim, w.element_size(),
                                w.element_size(), self.mesh.mesh)
        rows = self.num_embeddings // self.mesh.size(plan.vocab_axes)
        lo = self.mesh.group_rank(plan.vocab_axes) * rows if plan.vocab_axes else 0
        return _Call(self.mesh, steps, lo, rows, self.padding_idx)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, scheme={self.scheme}, axes={self.axes}, "
                f"dp={self.dp}, sp={self.sp}")


@builds("embedding")
def build_embedding(req: LayerRequest) -> ParallelEmbedding:
    """A planned embedding: the scheme value its options (T, dp, sp, shard_dim) name."""
    w = req.param("weight")
    if w is None or req.scheme not in EMBEDDING_SCHEMES:
        raise LayerBuildError(f"embedding op {req.op.name}: scheme {req.scheme!r} is not one the runtime implements")
    V, H = w.shape
    dense = SimpleNamespace(weight=w, num_embeddings=V, embedding_dim=H, padding_idx=req.op.attrs.get("padding_idx"))
    return ParallelEmbedding.from_dense(dense, req.mesh, req.scheme, axes=req.option("T", ()), dp=req.option("dp"),
                                        sp=bool(req.option("sp", False)), shard_dim=req.option("shard_dim"),
                                        token_shape=req.op.input_meta[0].shape, generator=req.generator,
                                        device=req.device)
