"""Layer norm: runs in the layout of its input, whatever splits it.

If the normalised (feature) dims are split over axes F, the forward all-reduces (sum x, sum x^2) over F
(2 fp32 per local token, tag stats) and the backward all-reduces two per-token sums (tag stats); gamma and
beta are split like the feature dims and their gradients all-reduced over the axes that split the tokens.
Token splits include sequence-split layouts, so Megatron's TP+SP (layer norm between a row-parallel
reduce-scatter and a column-parallel all-gather) is reachable. Saves its input plus fp32 mean and rstd
per token (fp32 on CUDA, the input's dtype on CPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cost_models.calls import Call
from cost_models.family import flops_per_elem, op_family
from cost_models.layout import Layout
from cost_models.memory import norm_stats_itemsize
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

__all__ = ["layer_norm_rule", "layer_norm_call"]

# (sum x, sum x^2) forward and two per-token sums backward, all-reduced in fp32 when features are split.
_REDUCED_BYTES_PER_TOKEN = 8


def _normalized_ndim(op: OpNode) -> int:
    shape = op.attrs.get("normalized_shape")
    if shape is not None:
        return len(shape) if isinstance(shape, (list, tuple)) else 1
    if op.params:
        return len(op.params[0].shape)
    return 1


def layer_norm_call(call: Call) -> dict[str, Any]:
    """F.layer_norm / aten.layer_norm / aten.native_layer_norm(x, normalized_shape, weight, bias, eps)."""
    shape, weight, eps = call.arg(1, "normalized_shape"), call.arg(2, "weight"), call.arg(4, "eps", 1e-5)
    return {"normalized_shape": tuple(shape), "eps": float(eps), "elementwise_affine": weight is not None}


def _layer_norm_module(m: Any) -> dict[str, Any]:
    return {"normalized_shape": tuple(m.normalized_shape), "eps": float(m.eps),
            "elementwise_affine": m.weight is not None}


# FLOPs per element: two reductions, normalise, scale and shift.
@op_family("layer_norm", ops=("layer_norm", "native_layer_norm"), classify=layer_norm_call,
           modules=("torch.nn.modules.normalization.LayerNorm",), module_attrs=_layer_norm_module,
           flops_per_elem=8, in_map=True, prices_params=True)
def layer_norm_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    x = op.input_meta[0]
    nd = len(x.shape)
    n_norm = _normalized_ndim(op)
    for lay in input_candidates_for(op, 0, candidates, mesh):
        feat_axes = tuple(a for d in lay.dims[nd - n_norm:] for a in d)
        tok_axes = tuple(a for d in lay.dims[: nd - n_norm] for a in d)
        tokens = 1
        for d in range(nd - n_norm):
            tokens *= x.shape[d] // mesh.size(lay.dims[d])
        u = Usage(mesh, dtype=x.dtype)
        sums = _REDUCED_BYTES_PER_TOKEN * tokens
        u.collective("all_reduce", feat_axes, sums, "forward", "stats")
        u.collective("all_reduce", feat_axes, sums, "backward", "stats")
        params = []
        p_layout = Layout(lay.dims[nd - n_norm:], interleave=lay.interleave if lay.dims[-1] else 1)
        for j, p in enumerate(op.params):
            meta = TensorMeta(p.shape, p.dtype)
            params.append((param_key(op, j), p_layout))
            u.param(p_layout.local_numel(p.shape, mesh))
            tag = "grad_bias" if p.role == "bias" else "grad_weight"
            u.collective("all_reduce", tok_axes, local_bytes(meta, p_layout, mesh), "backward", tag)
        x_bytes = local_bytes(x, lay, mesh)
        u.save(tensor_key(op.inputs[0], lay), x_bytes)
        u.save(f"{op.name}:stats:{lay}", 2 * norm_stats_itemsize(x.dtype, device) * tokens)  # mean, rstd
        u.fwd_flops = flops_per_elem("layer_norm") * lay.local_numel(x.shape, mesh)
        u.bwd_flops = 2 * u.fwd_flops
        u.fwd_bytes, u.bwd_bytes = 2 * x_bytes, 4 * x_bytes
        seq_split = nd - n_norm >= 2 and bool(lay.dims[nd - n_norm - 1])
        yield Strategy("seq" if seq_split else "follow", (lay,), (lay,), tuple(params)), u
