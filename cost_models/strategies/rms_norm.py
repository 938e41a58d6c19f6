"""RMSNorm (nn.RMSNorm, F.rms_norm, aten.rms_norm and HF's decomposed pow/mean/rsqrt/mul pattern, which
capture rewrites into one `rms_norm` call, `planner.trace.patterns`): planned like layer norm, in the
layout of its input. Registered here with its capture patterns (`cost_models.family`).

y = x * rsqrt(mean(x^2) + eps) * w over the last dim. With that (feature) dim split over axes F the
forward all-reduces sum(x^2) over F (one fp32 per local token, tag stats) and the backward one per-token
sum (sum g * xhat, tag stats); w is split like the feature dim, its gradient all-reduced over the axes
that split the tokens. The runtime (`layers3d.rms_norm`) computes the statistics in fp32 and saves its
input plus one fp32 rstd per token on every device, so that is what is priced here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cost_models.calls import Call
from cost_models.family import flops_per_elem, op_family
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, TensorMeta
from cost_models.strategies.base import (
    Candidates,
    Offer,
    Usage,
    input_candidates_for,
    local_bytes,
    param_key,
    tensor_key,
)
from cost_models.strategy import Strategy

__all__ = ["rms_norm_rule", "rms_norm_call", "RMS_STATS_BYTES"]

RMS_STATS_BYTES = 4  # one fp32 per token: sum x^2 forward, sum g*xhat backward, rstd saved


def rms_norm_call(call: Call) -> dict[str, Any]:
    """F.rms_norm(input, normalized_shape, weight=None, eps=None) / aten.rms_norm (same order); eps None is
    torch's default (the input dtype's epsilon)."""
    shape, weight, eps = call.arg(1, "normalized_shape"), call.arg(2, "weight"), call.arg(3, "eps")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return {"normalized_shape": shape, "eps": None if eps is None else float(eps),
            "elementwise_affine": weight is not None}


def _rms_norm_module(m: Any) -> dict[str, Any]:
    return {"normalized_shape": tuple(m.normalized_shape), "eps": None if m.eps is None else float(m.eps),
            "elementwise_affine": m.weight is not None}


# FLOPs per element: priced as layer norm (square, sum, rsqrt, scale, weight; memory-bound either way).
@op_family("rms_norm", ops=("rms_norm",), classify=rms_norm_call,
           modules=("torch.nn.modules.normalization.RMSNorm",), module_attrs=_rms_norm_module,
           flops_per_elem=8, in_map=True, prices_params=True)
def rms_norm_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    x = op.input_meta[0]
    nd = len(x.shape)
    stats = 8 if x.dtype == "float64" else RMS_STATS_BYTES
    cands = input_candidates_for(op, 0, candidates, mesh)
    if len(op.attrs.get("normalized_shape", (0,))) != 1:
        yield "rms_norm over more than the last dim: runs replicated"
        cands = [Layout.replicated(nd)]
    # Interleaved split features (a fused projection's output) are taken with the features whole: the
    # runtime stores the weight in contiguous blocks.
    cands = list(dict.fromkeys(Layout(c.dims[:-1] + ((),)) if c.interleave > 1 and c.dims[-1] else c
                               for c in cands))
    for lay in cands:
        feat_axes = lay.dims[-1]
        tok_axes = tuple(a for d in lay.dims[:-1] for a in d)
        tokens = lay.local_numel(x.shape, mesh) // max(1, lay.local_shape(x.shape, mesh)[-1])
        u = Usage(mesh, dtype=x.dtype)
        u.collective("all_reduce", feat_axes, stats * tokens, "forward", "stats")
        u.collective("all_reduce", feat_axes, stats * tokens, "backward", "stats")
        params = []
        p_layout = Layout((feat_axes,))
        for j, p in enumerate(op.params):
            params.append((param_key(op, j), p_layout))
            u.param(p_layout.local_numel(p.shape, mesh))
            u.collective("all_reduce", tok_axes, local_bytes(TensorMeta(p.shape, p.dtype), p_layout, mesh),
                         "backward", "grad_weight")
        x_bytes = local_bytes(x, lay, mesh)
        u.save(tensor_key(op.inputs[0], lay), x_bytes)
        u.save(f"{op.name}:rstd:{lay}", stats * tokens)
        u.fwd_flops = flops_per_elem("rms_norm") * lay.local_numel(x.shape, mesh)
        u.bwd_flops = 2 * u.fwd_flops
        u.fwd_bytes, u.bwd_bytes = 2 * x_bytes, 4 * x_bytes
        _working_sets(u, x, lay, mesh, trained_weight=bool(op.params))
        seq_split = nd >= 3 and bool(lay.dims[-2])
        yield Strategy("seq" if seq_split else "follow", (lay,), (lay,), tuple(params)), u


def _working_sets(u: Usage, x: TensorMeta, lay: Layout, mesh: Mesh, *, trained_weight: bool) -> None:
    """What `layers3d.rms_norm` allocates beyond the saved input and statistics, computing in fp32 (fp64
    for fp64 inputs). Backward: the output's gradient (as it arrives, and its fp32 copy), x normalised
    again, the weighted gradient, the input gradient and the product the weight's gradient sums, alive
    together, then the input gradient cast back. Measured on HF T5 (its T5LayerNorm, 8 gloo ranks, fp32):
    four input-sized fp32 tensors beside the output's gradient at the weight gradient's sum, the step's
    peak in a decoder block's backward. Forward: the normalised product (and the fp32 copy of x) beside
    the output."""
    x_bytes = local_bytes(x, lay, mesh)
    wide = lay.local_numel(x.shape, mesh) * (8 if x.dtype == "float64" else 4)
    cast = wide if x.itemsize * lay.local_numel(x.shape, mesh) != wide else 0
    u.temp(x_bytes + cast + (4 if trained_weight else 3) * wide + (x_bytes if cast else 0))
    u.fwd_temp(wide + cast)
