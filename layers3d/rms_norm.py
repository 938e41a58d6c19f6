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

import torch

from layers3d.builders import LayerRequest, builds
from layers3d.comm import all_reduce
from layers3d.mesh import DeviceMesh
from layers3d.norm import FeatureNorm, planned_norm
from layers3d.shard import ParamInit

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


class ParallelRMSNorm(FeatureNorm):
    """RMSNorm over the last dim (size `normalized_shape`) of this rank's block (see `FeatureNorm`). eps None:
    torch's default, the input dtype's epsilon."""

    WHAT = "rms norm"
    PARAMS = ("weight",)

    def __init__(self, normalized_shape: int | Sequence[int], mesh: DeviceMesh, *, features: Sequence[str] = (),
                 tokens: Sequence[str] = (), seq: Sequence[str] = (), eps: float | None = None,
                 elementwise_affine: bool = True, params: Sequence[str] | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 init_fn: ParamInit | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__(normalized_shape, mesh, features=features, tokens=tokens, seq=seq, eps=eps,
                         params=("weight",) if params is None and elementwise_affine else (params or ()),
                         dtype=dtype, device=device, init_fn=init_fn, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (*tokens_local, H/F) -> same shape and dtype (times the weight's dtype)."""
        self._local_features(x)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return _RMSNorm.apply(x, self.weight, self.size, eps, self.features, self.tokens + self.seq, self.mesh)


@builds("rms_norm")
def build_rms_norm(req: LayerRequest) -> ParallelRMSNorm:
    """A planned RMSNorm (eps as captured; None: the input dtype's epsilon)."""
    dense, features, tokens = planned_norm(req, "rms norm")
    return ParallelRMSNorm.from_dense(dense, req.mesh, features=features, tokens=tokens, generator=req.generator,
                                      device=req.device)
