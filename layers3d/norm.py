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

__all__ = ["FeatureNorm", "ParallelLayerNorm", "build_layer_norm", "planned_norm"]

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


class FeatureNorm(nn.Module):
    """What a norm over the last dim split over mesh axes F shares (layer norm, RMSNorm): the axes, the
    affine parameters split like the feature dim, sharding from and gathering back to the dense module,
    and the layout it runs in. Subclasses set `WHAT` (for messages) and `PARAMS` (the affine parameter
    names, in order) and define `forward`.

    features: axes splitting the feature dim (F); tokens: axes splitting the tokens (batch first); seq:
    sequence-parallel axes on the last token dim. Axes in none of them hold replicas.
    """

    WHAT = "norm"
    PARAMS: tuple[str, ...] = ("weight",)

    def __init__(self, normalized_shape: int | Sequence[int], mesh: DeviceMesh, *, features: Sequence[str] = (),
                 tokens: Sequence[str] = (), seq: Sequence[str] = (), eps: float | None = 1e-5,
                 params: Sequence[str] = (), dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", init_fn: ParamInit | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if isinstance(normalized_shape, (tuple, list)):
            if len(normalized_shape) != 1:
                raise ShardingError(f"{type(self).__name__} normalises the last dim only, got {normalized_shape}")
            normalized_shape = normalized_shape[0]
        self.mesh, self.size, self.eps = mesh, int(normalized_shape), eps
        self.features, self.tokens, self.seq = tuple(features), tuple(tokens), tuple(seq)
        used = self.features + self.tokens + self.seq
        if len(set(used)) != len(used) or any(a not in mesh.axis_names for a in used):
            raise ShardingError(f"features {self.features}, tokens {self.tokens} and seq {self.seq} must be "
                                f"distinct axes of mesh {mesh.mesh}")
        check_divisible(self.size, self.features, mesh.mesh, f"{self.WHAT} feature dim",
                        "choose a hidden size divisible by the split or fewer feature axes")
        local = (self.size // mesh.size(self.features),)
        for name in self.PARAMS:
            value = None
            if name in params:
                value = nn.Parameter(init_shard(name, local, (self.features,), mesh.mesh, mesh.rank, init_fn=init_fn,
                                                generator=generator, dtype=dtype, device=device,
                                                init_name="norm_weight" if name == "weight" else None))
            setattr(self, name, value)

    @classmethod
    def from_dense(cls, dense: nn.Module, mesh: DeviceMesh, *, features: Sequence[str] = (),
                   tokens: Sequence[str] = (), seq: Sequence[str] = (), init_fn: ParamInit | None = None,
                   generator: torch.Generator | None = None, device: torch.device | str | None = None) -> FeatureNorm:
        """Shard a dense norm (anything with `normalized_shape`, `eps` and the affine parameters, None when
        absent); a meta-device one is initialised shard by shard, see ParallelLinear."""
        dense_params = {n: getattr(dense, n, None) for n in cls.PARAMS}
        present = {n: p for n, p in dense_params.items() if p is not None}
        first = next(iter(present.values()), None)
        meta = first is not None and first.device.type == "meta"
        out = cls(dense.normalized_shape, mesh, features=features, tokens=tokens, seq=seq, eps=dense.eps,
                  params=tuple(present), dtype=first.dtype if first is not None else torch.float32,
                  device=device or ("cpu" if meta or first is None else first.device), init_fn=init_fn,
                  generator=generator)
        if not meta:
            with torch.no_grad():
                for name, p in present.items():
                    getattr(out, name).copy_(local_block(p.detach(), (out.features,), mesh.mesh, mesh.rank))
        return out

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        """The full affine parameters (collective), keyed as the dense module's."""
        return {n: gather_tensor(getattr(self, n), (self.features,), self.mesh) for n in self.PARAMS
                if getattr(self, n) is not None}

    def stored_placement(self, attr: str) -> StoredPlacement:
        """The affine parameters are split like the feature dim."""
        return StoredPlacement((self.features,))

    def layout(self, shape: Sequence[int]) -> Layout:
        """Layout of the input (and output) of global shape [*tokens, H]."""
        return Layout(token_dims(shape[:-1], self.tokens, self.seq, self.mesh.mesh, f"{self.WHAT} input")
                      + (self.features,))

    def _local_features(self, x: torch.Tensor) -> int:
        local = self.size // self.mesh.size(self.features)
        if x.shape[-1] != local:
            raise ShardingError(f"{self.WHAT} expects {local} local features (H={self.size} over {self.features}), "
                                f"got input of shape {tuple(x.shape)}")
        return local

    def extra_repr(self) -> str:
        return f"{self.size}, features={self.features}, tokens={self.tokens}, seq={self.seq}, eps={self.eps}"


class ParallelLayerNorm(FeatureNorm):
    """Layer norm over the last dim (size `normalized_shape`) of this rank's block (see `FeatureNorm`)."""

    WHAT = "layer norm"
    PARAMS = ("weight", "bias")

    def __init__(self, normalized_shape: int | Sequence[int], mesh: DeviceMesh, *, features: Sequence[str] = (),
                 tokens: Sequence[str] = (), seq: Sequence[str] = (), eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, params: Sequence[str] | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 init_fn: ParamInit | None = None, generator: torch.Generator | None = None) -> None:
        if params is None:
            params = (("weight",) + (("bias",) if bias else ())) if elementwise_affine else ()
        super().__init__(normalized_shape, mesh, features=features, tokens=tokens, seq=seq, eps=eps, params=params,
                         dtype=dtype, device=device, init_fn=init_fn, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (*tokens_local, H/F) -> same shape."""
        local = self._local_features(x)
        tok = self.tokens + self.seq
        if not self.features or self.mesh.size(self.features) == 1:
            w = reduce_grad(self.weight, tok, self.mesh) if self.weight is not None else None
            b = reduce_grad(self.bias, tok, self.mesh, tag="grad_bias") if self.bias is not None else None
            return F.layer_norm(x, (local,), w, b, self.eps)
        return _SplitLayerNorm.apply(x, self.weight, self.bias, self.size, self.eps, self.features, tok, self.mesh)


def planned_norm(req: LayerRequest, what: str) -> tuple[SimpleNamespace, Axes, Axes]:
    """A planned norm runs in its input's layout: (the dense norm's parameters and settings, the axes splitting
    the features, those splitting the tokens)."""
    lay = req.inputs[0] if req.inputs else None
    shape = tuple(req.op.attrs.get("normalized_shape", ()))
    if lay is None or len(shape) != 1:
        raise LayerBuildError(f"{what} {req.op.name}: only a norm over the last dim with a planned input layout "
                              f"is supported (normalized_shape {shape})")
    dense = SimpleNamespace(weight=req.param("weight"), bias=req.param("bias"), normalized_shape=shape,
                            eps=req.op.attrs.get("eps"))
    return dense, lay.dims[-1], tuple(ax for d in lay.dims[:-1] for ax in d)


@builds("layer_norm")
def build_layer_norm(req: LayerRequest) -> ParallelLayerNorm:
    """A planned layer norm (eps 1e-5 unless captured)."""
    dense, features, tokens = planned_norm(req, "layer norm")
    dense.eps = 1e-5 if dense.eps is None else float(dense.eps)
    return ParallelLayerNorm.from_dense(dense, req.mesh, features=features, tokens=tokens, generator=req.generator,
                                        device=req.device)
