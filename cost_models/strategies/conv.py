"""Convolutions (nn.Conv1d/2d/3d, F.conv*d, aten.conv*d / aten.convolution): run whole, or output channels
split.

A convolution is independent over its batch dim, so it has every strategy of an op run whole
(`cost_models.strategies.opaque`: replicate or fsdp parameters, on a data-parallel block of the batch),
plus, for groups = 1:

* `1d_col` (t=T): weight [Cout, Cin, *k] stored and used split over T on Cout (bias likewise); the input
  arrives with its batch split over dp (the other axes) and whole over T; the output has its batch over
  dp and its channel dim (1) over T. No forward collective; the input gradient is a partial sum over T
  (each rank's channels contribute), all-reduced over T in backward (tag grad_input); the parameter
  gradients are all-reduced over dp (tag grad_weight). Saves its input (the weight is state).

The runtime is `layers3d.whole` (the parameters used as stored) with a gradient all-reduce on the input.
What the whole-op strategies need to know (`conv_facts`) follows from the shapes: a batched input (one dim
more than the kernel's spatial dims + 1) is independent over dim 0, and the op saves its input.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from cost_models.calls import Act, Call, Param
from cost_models.family import op_family
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import DTYPE_BYTES, FLOAT_DTYPES, OpNode
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
from cost_models.strategies.opaque import whole_offers
from cost_models.strategy import Strategy

__all__ = ["conv_rule", "conv_call", "conv_facts"]


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
            u.param(local)
            u.collective("all_reduce", dp, local * DTYPE_BYTES[p.dtype], "backward", "grad_weight")
        if x.dtype in FLOAT_DTYPES and (op.attrs.get("grad_inputs") or (True,))[0]:  # not a graph input's
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


def conv_call(call: Call) -> dict[str, Any] | None:
    """F.conv*d(x, W, b, stride, padding, dilation, groups) / aten.conv*d (same order) /
    aten.convolution(x, W, b, stride, padding, dilation, transposed, output_padding, groups): an
    activation convolved with a parameter (a transposed convolution is not this family)."""
    x, w = call.arg(0, "input"), call.arg(1, "weight")
    if not (isinstance(x, Act) and isinstance(w, Param)) or len(call.outputs) != 1:
        return None
    if call.op == "convolution":
        if call.arg(6, "transposed", False):
            return None
        return {"groups": int(call.arg(8, "groups", 1))}
    return {"groups": int(call.arg(6, "groups", 1))}


def _conv_module(m: Any) -> dict[str, Any]:
    return {"groups": int(m.groups)}


def conv_facts(op: OpNode) -> dict[str, Any]:
    """What the whole-op strategies read (`cost_models.strategies.opaque`), from the shapes: independent
    over the batch dim 0 of a batched input; saves its input (the weight is state); no buffers."""
    x = op.input_meta[0]
    batched = bool(op.params) and len(x.shape) == len(op.params[0].shape)
    n_in = len(op.input_meta)
    return {"module": op.target, "batch_dims": (0,) + (None,) * (n_in - 1) if batched else None,
            "out_batch_dims": (0,) if batched else None, "batch_note": "" if batched else "unbatched input",
            "buffer_bytes": 0, "saved_inputs": (0,), "saved_bytes": 0, "saved_source": "rule"}


@op_family("conv", ops=("conv1d", "conv2d", "conv3d", "convolution"), classify=conv_call,
           modules=tuple(f"torch.nn.modules.conv.Conv{d}d" for d in (1, 2, 3)), module_attrs=_conv_module,
           in_map=True, prices_params=True)
def conv_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    facts = conv_facts(op)
    yield from whole_offers(op, mesh, facts)
    if facts["batch_dims"] is None:
        yield "1d_col: unbatched input"
        return
    if int(op.attrs.get("groups", 1)) != 1 or not op.params or len(op.outputs) != 1:
        yield "1d_col: grouped convolution (channels split only for groups = 1)"
        return
    yield from _channel_split(op, mesh)
