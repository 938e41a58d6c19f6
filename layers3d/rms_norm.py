"""ParallelRMSNorm: RMSNorm over a feature dim that may be split over mesh axes F.

y = (x * rsqrt(mean(x^2) + eps)).to(x.dtype) * w, statistics in fp32 (as HF's LlamaRMSNorm and
torch's rms_norm compute them). With the features split each rank holds H/F features of its tokens: the
forward all-reduces sum(x^2) over F (tag stats, one fp32 per local token), the backward the one sum
(sum g * xhat) the input gradient needs. w is split like the feature dim; its gradient is all-reduced over
the axes splitting the tokens (tag grad_weight). Saved for backward, on every device: the input and one
fp32 rstd per token (what `cost_models.strategies.rms_norm` prices).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
from torch import nn

from cost_models.layout import Layout
from layers3d.builders import LayerRequest, StoredPlacement, builds
from layers3d.comm import all_reduce
from layers3d.errors import LayerBuildError, ShardingError
from layers3d.mesh import DeviceMesh
from layers3d.shard import ParamInit, check_divisible, gather_tensor, init_shard, local_block
from layers3d.tokens import token_dims

__all__ = ["ParallelRMSNorm", "build_rms_norm"]

Axes = tuple[str, ...]


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor | None, size: int, eps: float, feat: Axes, tok: Axes,
                mesh: DeviceMesh) -> torch.Tensor:
        xs = x.to(_stats_dtype(x.dtype))                                       # (*tok, H/F)
        sq = all_reduce((xs * xs).sum(-1), feat, mesh, tag="stats")            # (*tok,)
        rstd = torch.rsqrt(sq / size + eps)
        y = (xs * rstd[..., None]).to(x.dtype)
        if w is not None:
            y = y * w
        ctx.size, ctx.feat, ctx.tok, ctx.mesh, ctx.has_w = size, feat, tok, mesh, w is not None
        ctx.save_for_backward(x, rstd, w)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, rstd, w = ctx.saved_tensors
        dt = rstd.dtype
        xhat = x.to(dt) * rstd[..., None]
        dys = dy.to(dt)
        g = dys * w.to(dt) if ctx.has_w else dys
        s = all_reduce((g * xhat).sum(-1), ctx.feat, ctx.mesh, tag="stats")
        dx = rstd[..., None] * (g - xhat * (s / ctx.size)[..., None])
        dw = None
        if ctx.has_w and ctx.needs_input_grad[1]:
            flat = dys.reshape(-1, dys.shape[-1])
            dw = (flat * xhat.reshape(flat.shape)).sum(0).to(w.dtype)
            dw = all_reduce(dw, ctx.tok, ctx.mesh, tag="grad_weight")
        return dx.to(x.dtype), dw, None, None, None, None, None


class ParallelRMSNorm(nn.Module):
    """RMSNorm over the last dim (size `normalized_shape`) of this rank's block.

    features: axes splitting the feature dim (F); tokens: axes splitting the tokens (batch first); seq:
    sequence-parallel axes on the last token dim. eps None: torch's default, the input dtype's epsilon.
    """

    def __init__(self, normalized_shape: int | Sequence[int], mesh: DeviceMesh, *, features: Sequence[str] = (),
                 tokens: Sequence[str] = (), seq: Sequence[str] = (), eps: float | None = None,
                 elementwise_affine: bool = True, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", init_fn: ParamInit | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if isinstance(normalized_shape, (tuple, list)):
            if len(normalized_shape) != 1:
                raise ShardingError(f"ParallelRMSNorm normalises the last dim only, got {normalized_shape}")
            normalized_shape = normalized_shape[0]
        self.mesh, self.size, self.eps = mesh, int(normalized_shape), eps
        self.features, self.tokens, self.seq = tuple(features), tuple(tokens), tuple(seq)
        used = self.features + self.tokens + self.seq
        if len(set(used)) != len(used) or any(a not in mesh.axis_names for a in used):
            raise ShardingError(f"features {self.features}, tokens {self.tokens} and seq {self.seq} must be "
                                f"distinct axes of mesh {mesh.mesh}")
        check_divisible(self.size, self.features, mesh.mesh, "rms norm feature dim",
                        "choose a hidden size divisible by the split or fewer feature axes")
        local = (self.size // mesh.size(self.features),)
        self.weight = None
        if elementwise_affine:
            self.weight = nn.Parameter(init_shard("weight", local, (self.features,), mesh.mesh, mesh.rank,
                                                  init_fn=init_fn, generator=generator, dtype=dtype, device=device,
                                                  init_name="norm_weight"))

    @classmethod
    def from_dense(cls, dense: nn.Module, mesh: DeviceMesh, *, features: Sequence[str] = (),
                   tokens: Sequence[str] = (), seq: Sequence[str] = (), init_fn: ParamInit | None = None,
                   generator: torch.Generator | None = None,
                   device: torch.device | str | None = None) -> ParallelRMSNorm:
        """Shard an nn.RMSNorm (or anything with `weight`, `normalized_shape`, `eps`); a meta-device one is
        initialised shard by shard."""
        w = dense.weight
        meta = w is not None and w.device.type == "meta"
        out = cls(dense.normalized_shape, mesh, features=features, tokens=tokens, seq=seq, eps=dense.eps,
                  elementwise_affine=w is not None, dtype=w.dtype if w is not None else torch.float32,
                  device=device or ("cpu" if meta or w is None else w.device), init_fn=init_fn, generator=generator)
        if w is not None and not meta:
            with torch.no_grad():
                out.weight.copy_(local_block(w.detach(), (out.features,), mesh.mesh, mesh.rank))
        return out

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weight (collective), keyed as nn.RMSNorm's."""
        return {} if self.weight is None else {"weight": gather_tensor(self.weight, (self.features,), self.mesh)}

    def stored_placement(self, attr: str) -> StoredPlacement:
        """The weight is split like the feature dim."""
        return StoredPlacement((self.features,))

    def layout(self, shape: Sequence[int]) -> Layout:
        """Layout of the input (and output) of global shape [*tokens, H]."""
        return Layout(token_dims(shape[:-1], self.tokens, self.seq, self.mesh.mesh, "rms norm input")
                      + (self.features,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (*tokens_local, H/F) -> same shape and dtype (times the weight's dtype)."""
        local = self.size // self.mesh.size(self.features)
        if x.shape[-1] != local:
            raise ShardingError(f"rms norm expects {local} local features (H={self.size} over {self.features}), "
                                f"got input of shape {tuple(x.shape)}")
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return _RMSNorm.apply(x, self.weight, self.size, eps, self.features, self.tokens + self.seq, self.mesh)

    def extra_repr(self) -> str:
        return f"{self.size}, features={self.features}, tokens={self.tokens}, seq={self.seq}, eps={self.eps}"


@builds("rms_norm")
def build_rms_norm(req: LayerRequest) -> ParallelRMSNorm:
    """A planned RMSNorm runs in its input's layout: features split like the input's last dim."""
    lay = req.inputs[0] if req.inputs else None
    shape = tuple(req.op.attrs.get("normalized_shape", ()))
    if lay is None or len(shape) != 1:
        raise LayerBuildError(f"rms norm {req.op.name}: only a norm over the last dim with a planned input layout "
                              f"is supported (normalized_shape {shape})")
    dense = SimpleNamespace(weight=req.param("weight"), normalized_shape=shape, eps=req.op.attrs.get("eps"))
    return ParallelRMSNorm.from_dense(dense, req.mesh, features=lay.dims[-1],
                                      tokens=tuple(ax for d in lay.dims[:-1] for ax in d),
                                      generator=req.generator, device=req.device)
