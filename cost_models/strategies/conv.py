"""Convolutions (nn.Conv1d/2d/3d, F.conv*d, aten.conv*d): run whole, or output channels split.

A convolution is independent over its batch dim, so it has every strategy of an op run whole
(`cost_models.strategies.opaque`: replicate or fsdp parameters, on a data-parallel block of the batch),
plus, for groups = 1:

* `1d_col` (t=T): weight [Cout, Cin, *k] stored and used split over T on Cout (bias likewise); the input
  arrives with its batch split over dp (the other axes) and whole over T; the output has its batch over
  dp and its channel dim (1) over T. No forward collective; the input gradient is a partial sum over T
  (each rank's channels contribute), all-reduced over T in backward (tag grad_input); the parameter
  gradients are all-reduced over dp (tag grad_weight). Saves its input (the weight is state).

The runtime is `layers3d.whole` (the parameters used as stored) with a gradient all-reduce on the input.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import DTYPE_BYTES, OpNode
from cost_models.strategies import register
from cost_models.strategies.base import (
    Candidates,
    Offer,
    Usage,
    axis_subsets,
    local_bytes,
    make_options,
    param_key,
    rest_axes,
    tensor_key,
)
from cost_models.strategies.opaque import opaque_rule
from cost_models.strategy import Strategy

__all__ = ["conv_rule"]

_FLOAT = ("float16", "bfloat16", "float32", "float64")


def _channel_split(op: OpNode, mesh: Mesh) -> Iterator[Offer | str]:
    x, y = op.input_meta[0], op.outputs[0]
    weight = op.params[0]
    cout, per_out = weight.shape[0], math.prod(weight.shape[1:])
    for t_axes in axis_subsets(mesh):
        dp = rest_axes(mesh, t_axes)
        label = f"1d_col[T={''.join(t_axes)}]"
        if cout % mesh.size(t_axes):
            yield f"{label}: {cout} output channels not divisible by {mesh.size(t_axes)}"
            continue
        if x.shape[0] % mesh.size(dp):
            yield f"{label}: batch {x.shape[0]} not divisible by {mesh.size(dp)} (axes {''.join(dp)})"
            continue
        lay_x = Layout.shard(len(x.shape), 0, dp) if dp else Layout.replicated(len(x.shape))
        dims = [()] * len(y.shape)
        dims[0], dims[1] = dp, t_axes
        lay_y = Layout(tuple(dims))
        u = Usage(mesh, dtype=y.dtype)
        params = []
        for i, p in enumerate(op.params):
            lay = Layout.shard(len(p.shape), 0, t_axes)
            params.append((param_key(op, i), lay))
            local = lay.local_numel(p.shape, mesh)
            u.param_elems += local
            u.collective("all_reduce", dp, local * DTYPE_BYTES[p.dtype], "backward", "grad_weight")
        if x.dtype in _FLOAT and (op.attrs.get("grad_inputs") or (True,))[0]:  # not a graph input's
            u.collective("all_reduce", t_axes, local_bytes(x, lay_x, mesh), "backward", "grad_input")
        u.save(tensor_key(op.inputs[0], lay_x), local_bytes(x, lay_x, mesh))
        out_local = lay_y.local_numel(y.shape, mesh)
        u.fwd_flops = 2.0 * out_local * per_out
        u.bwd_flops = 2 * u.fwd_flops
        moved = local_bytes(x, lay_x, mesh) + local_bytes(y, lay_y, mesh)
        u.fwd_bytes, u.bwd_bytes = moved, 2 * moved
        u.temp(local_bytes(x, lay_x, mesh))  # the input gradient before its all-reduce
        ins = (lay_x,) + tuple(Layout.replicated(len(m.shape)) for m in op.input_meta[1:])
        yield Strategy("1d_col", ins, (lay_y,), tuple(params), make_options(T=t_axes, dp=dp)), u


@register("conv")
def conv_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    yield from opaque_rule(op, mesh, candidates, device)
    if int(op.attrs.get("groups", 1)) != 1 or not op.params or len(op.outputs) != 1:
        yield "1d_col: grouped convolution (channels split only for groups = 1)"
        return
    yield from _channel_split(op, mesh)
