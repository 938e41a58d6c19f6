"""ParallelLayerNorm: layer norm over a feature dim that may be split over mesh axes F.

With F empty it is torch's layer norm on the local tokens. With the features split (3D / 2D layouts)
each rank holds H/F features of its tokens: forward all-reduces (sum x, sum x^2) over F (tag stats, two
fp32 numbers per local token) and backward the two sums (sum g, sum g*xhat) the input gradient needs.
gamma/beta are split like the feature dim; their gradients are all-reduced over the axes splitting the
tokens (tags grad_weight / grad_bias). Saved for backward: the input, mean and rstd (as torch's).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

from cost_models.layout import Layout
from layers3d.builders import LayerRequest, StoredPlacement, builds
from layers3d.comm import all_reduce
from layers3d.data_parallel import reduce_grad
from layers3d.errors import LayerBuildError, ShardingError
from layers3d.mesh import DeviceMesh
from layers3d.shard import ParamInit, check_divisible, gather_tensor, init_shard, local_block
from layers3d.tokens import token_dims

__all__ = ["ParallelLayerNorm", "build_layer_norm"]

Axes = tuple[str, ...]


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _SplitLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None, size: int, eps: float,
                feat: Axes, tok: Axes, mesh: DeviceMesh) -> torch.Tensor:
        xs = x.to(_stats_dtype(x.dtype))                                  # (*tok, H/F)
        sums = all_reduce(torch.stack([xs.sum(-1), (xs * xs).sum(-1)], -1), feat, mesh, tag="stats")  # (*tok, 2)
        mean = sums[..., 0] / size
        rstd = torch.rsqrt((sums[..., 1] / size - mean * mean).clamp_min(0) + eps)
        xhat = (xs - mean[..., None]) * rstd[..., None]
        y = xhat.to(x.dtype)
        y = y * w if w is not None else y
        y = y + b if b is not None else y
        ctx.size, ctx.feat, ctx.tok, ctx.mesh = size, feat, tok, mesh
        ctx.has_w, ctx.has_b = w is not None, b is not None
        ctx.save_for_backward(x, mean, rstd, w)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, mean, rstd, w = ctx.saved_tensors
        dt = _stats_dtype(x.dtype)
        xhat = (x.to(dt) - mean[..., None]) * rstd[..., None]
        dys = dy.to(dt)
        g = dys * w.to(dt) if ctx.has_w else dys
        sums = all_reduce(torch.stack([g.sum(-1), (g * xhat).sum(-1)], -1), ctx.feat, ctx.mesh, tag="stats")
        dx = rstd[..., None] * (g - sums[..., :1] / ctx.size - xhat * sums[..., 1:] / ctx.size)
        flat = dys.reshape(-1, dys.shape[-1])
        dw = db = None
        if ctx.has_w and ctx.needs_input_grad[1]:
            dw = (flat * xhat.reshape(flat.shape)).sum(0).to(w.dtype)
            dw = all_reduce(dw, ctx.tok, ctx.mesh, tag="grad_weight")
        if ctx.has_b and ctx.needs_input_grad[2]:
            db = all_reduce(flat.sum(0).to(dy.dtype), ctx.tok, ctx.mesh, tag="grad_bias")
        return dx.to(x.dtype), dw, db, None, None, None, None, None


class ParallelLayerNorm(nn.Module):
    """Layer norm over the last dim (size `normalized_shape`) of this rank's block.

    features: axes splitting the feature dim (F); tokens: axes splitting the tokens (batch first);
    seq: sequence-parallel axes on the last token dim. Axes in none of them hold replicas.
    """

    def __init__(self, normalized_shape: int, mesh: DeviceMesh, *, features: Sequence[str] = (),
                 tokens: Sequence[str] = (), seq: Sequence[str] = (), eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", init_fn: ParamInit | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if isinstance(normalized_shape, (tuple, list)):
            if len(normalized_shape) != 1:
                raise ShardingError(f"ParallelLayerNorm normalises the last dim only, got {normalized_shape}")
            normalized_shape = normalized_shape[0]
        self.mesh, self.size, self.eps = mesh, int(normalized_shape), eps
        self.features, self.tokens, self.seq = tuple(features), tuple(tokens), tuple(seq)
        used = self.features + self.tokens + self.seq
        if len(set(used)) != len(used) or any(a not in mesh.axis_names for a in used):
            raise ShardingError(f"features {self.features}, tokens {self.tokens} and seq {self.seq} must be "
                                f"distinct axes of mesh {mesh.mesh}")
        check_divisible(self.size, self.features, mesh.mesh, "layer norm feature dim",
                        "choose a hidden size divisible by the split or fewer feature axes")
        local = (self.size // mesh.size(self.features),)
        self.weight = self.bias = None
        if elementwise_affine:
            self.weight = nn.Parameter(init_shard("weight", local, (self.features,), mesh.mesh, mesh.rank,
                                                  init_fn=init_fn, generator=generator, dtype=dtype, device=device,
                                                  init_name="norm_weight"))
            if bias:
                self.bias = nn.Parameter(init_shard("bias", local, (self.features,), mesh.mesh, mesh.rank,
                                                    init_fn=init_fn, generator=generator, dtype=dtype,
                                                    device=device))

    @classmethod
    def from_dense(cls, dense: nn.LayerNorm, mesh: DeviceMesh, *, features: Sequence[str] = (),
                   tokens: Sequence[str] = (), seq: Sequence[str] = (), init_fn: ParamInit | None = None,
                   generator: torch.Generator | None = None,
                   device: torch.device | str | None = None) -> ParallelLayerNorm:
        """Shard an nn.LayerNorm (a meta-device one is initialised shard by shard, see ParallelLinear)."""
        w = dense.weight
        meta = w is not None and w.device.type == "meta"
        dtype = w.dtype if w is not None else torch.float32
        out = cls(dense.normalized_shape, mesh, features=features, tokens=tokens, seq=seq, eps=dense.eps,
                  elementwise_affine=w is not None, bias=dense.bias is not None, dtype=dtype,
                  device=device or ("cpu" if meta or w is None else w.device), init_fn=init_fn, generator=generator)
        if w is not None and not meta:
            with torch.no_grad():
                for name in ("weight", "bias"):
                    if getattr(out, name) is not None:
                        getattr(out, name).copy_(local_block(getattr(dense, name).detach(), (out.features,),
                                                             mesh.mesh, mesh.rank))
        return out

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        """Full gamma/beta (collective), keys as nn.LayerNorm's."""
        return {n: gather_tensor(p, (self.features,), self.mesh) for n, p in (("weight", self.weight),
                                                                              ("bias", self.bias)) if p is not None}

    def stored_placement(self, attr: str) -> StoredPlacement:
        """gamma and beta are split like the feature dim."""
        return StoredPlacement((self.features,))

    def layout(self, shape: Sequence[int]) -> Layout:
        """Layout of the input (and output) of global shape [*tokens, H]."""
        return Layout(token_dims(shape[:-1], self.tokens, self.seq, self.mesh.mesh, "layer norm input")
                      + (self.features,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (*tokens_local, H/F) -> same shape."""
        local = self.size // self.mesh.size(self.features)
        if x.shape[-1] != local:
            raise ShardingError(f"layer norm expects {local} local features (H={self.size} over {self.features}), "
                                f"got input of shape {tuple(x.shape)}")
        tok = self.tokens + self.seq
        if not self.features or self.mesh.size(self.features) == 1:
            w = reduce_grad(self.weight, tok, self.mesh) if self.weight is not None else None
            b = reduce_grad(self.bias, tok, self.mesh, tag="grad_bias") if self.bias is not None else None
            return F.layer_norm(x, (local,), w, b, self.eps)
        return _SplitLayerNorm.apply(x, self.weight, self.bias, self.size, self.eps, self.features, tok, self.mesh)

    def extra_repr(self) -> str:
        return f"{self.size}, features={self.features}, tokens={self.tokens}, seq={self.seq}, eps={self.eps}"


@builds("layer_norm")
def build_layer_norm(req: LayerRequest) -> ParallelLayerNorm:
    """A planned layer norm runs in its input's layout: features split like the input's last dim."""
    lay = req.inputs[0] if req.inputs else None
    shape = tuple(req.op.attrs.get("normalized_shape", ()))
    if lay is None or len(shape) != 1:
        raise LayerBuildError(f"layer norm {req.op.name}: only a norm over the last dim with a planned input layout "
                              f"is supported (normalized_shape {shape})")
    dense = SimpleNamespace(weight=req.param("weight"), bias=req.param("bias"), normalized_shape=shape,
                            eps=float(req.op.attrs.get("eps", 1e-5)))
    tokens = tuple(ax for d in lay.dims[:-1] for ax in d)
    return ParallelLayerNorm.from_dense(dense, req.mesh, features=lay.dims[-1], tokens=tokens,
                                        generator=req.generator, device=req.device)
