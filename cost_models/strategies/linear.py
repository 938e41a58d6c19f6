"""Linear ops (y = x W^T + b): every scheme of docs/ARCHITECTURE.md on every axis assignment.

Captured from nn.Linear, HF's Conv1D (weight stored [in, out]: attrs["weight_transposed"]), F.linear,
aten.linear, aten.addmm(bias, x, W) and a matmul of an activation by a 2-d parameter.

The schemes themselves are defined once, in `cost_models.linear_scheme`: `linear_plans` enumerates the
(scheme, `LinearPlan`) pairs the shapes allow and `linear_steps` gives every collective of a plan as
redistribution steps. This rule prices exactly those steps, and `layers3d.ParallelLinear` executes
exactly those steps, so what is priced is what runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cost_models.calls import Act, Call, Param
from cost_models.family import op_family
from cost_models.layout import Layout
from cost_models.linear_scheme import LinearPlan, LinearScheme, linear_plans, linear_steps
from cost_models.memory import conversion_working_set
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, ParamInfo, TensorMeta
from cost_models.redistribution import backward_steps
from cost_models.strategies.base import (
    Candidates,
    Offer,
    Usage,
    axis_subsets,
    cube_permutations,
    local_bytes,
    make_options,
    ordered_pairs,
    param_key,
    tensor_key,
)
from cost_models.strategy import Strategy

__all__ = ["LinearPlan", "linear_rule", "linear_call", "linear_usage", "matmul_param_layout", "op_linear_plans"]


def matmul_param_layout(op: OpNode, n_axes: tuple[str, ...], k_axes: tuple[str, ...], interleave: int = 1) -> Layout:
    """W's layout in its stored orientation: [N, K] for nn.Linear, [K, N] for HF Conv1D
    (attrs["weight_transposed"]). Interleave is expressible only when N is the last stored dim."""
    if op.attrs.get("weight_transposed"):
        return Layout((k_axes, n_axes), interleave=interleave if n_axes else 1)
    return Layout((n_axes, k_axes))


def _weight(op: OpNode) -> tuple[int, ParamInfo]:
    for j, p in enumerate(op.params):
        if p.role == "weight":
            return j, p
    raise ValueError(f"linear op {op.name} has no weight parameter (params: {[p.name for p in op.params]})")


def _bias(op: OpNode) -> tuple[int, ParamInfo] | None:
    for j, p in enumerate(op.params):
        if p.role == "bias":
            return j, p
    return None


def op_linear_plans(op: OpNode, mesh: Mesh) -> Iterator[tuple[LinearScheme, LinearPlan] | str]:
    """Every (scheme, plan) the op's shapes allow (axis choices reduced by the mesh's symmetry), and a
    reason for each that they do not."""
    seg = int(op.attrs.get("out_segments", 1) or 1)
    yield from linear_plans(tuple(op.input_meta[0].shape), op.out.shape[-1], mesh, seg,
                            subsets=axis_subsets(mesh), pairs=ordered_pairs(mesh), triples=cube_permutations(mesh))


def linear_usage(op: OpNode, plan: LinearPlan, mesh: Mesh) -> Usage:
    """Elements, bytes, FLOPs and collectives of one linear strategy (see the module docstring)."""
    x, y = op.input_meta[0], op.out
    wj, wp = _weight(op)
    bias = _bias(op)
    u = Usage(mesh, dtype=x.dtype)
    w_shape_nk = (y.shape[-1], x.shape[-1])
    w_store = Layout(plan.w_store)
    w_eff = Layout(plan.w_eff)
    w_item = TensorMeta(wp.shape, wp.dtype).itemsize

    y_eff = plan.y_eff
    k_axes = plan.x_eff.dims[-1]
    st = linear_steps(plan, tuple(x.shape), y.shape[-1], x.itemsize, w_item, mesh)

    # Forward collectives.
    x_gather, w_gather, y_reduce = st.x_fwd, st.w_fwd, st.y_fwd
    u.steps(x_gather, "forward", "input")
    u.steps(w_gather, "forward", "weight")
    u.steps(y_reduce, "forward", "output")

    # Backward collectives. No input gradient (the input is computed from graph inputs alone, hint
    # grad_inputs): backward neither re-gathers W for dX nor reduces dX.
    u.steps(st.dy, "backward", "grad_output")
    if plan.save_input == "in" and x_gather:
        u.steps(x_gather, "backward", "input")
    input_grad = bool((op.attrs.get("grad_inputs") or (True,))[0])
    if plan.regather_weight and input_grad:
        u.steps(w_gather, "backward", "weight")
    if input_grad:
        u.steps(st.dx, "backward", "grad_input")
    u.steps(st.dw_scatter, "backward", "grad_weight")
    u.steps(st.dw_reduce, "backward", "grad_weight")
    w_eff_bytes = local_bytes(w_shape_nk, w_eff, mesh, w_item)
    w_store_bytes = local_bytes(w_shape_nk, w_store, mesh, w_item)

    # Parameters (and the bias, stored like y's feature dim, its gradient summed over y's token axes).
    # A weight tied to an earlier op's parameter (hint tied) is that op's state, not this one's.
    u.param(0 if "weight" in op.attrs.get("tied", ()) else w_store.local_numel(w_shape_nk, mesh))
    if bias is not None:
        b_layout = plan.bias_layout
        b_meta = TensorMeta(bias[1].shape, bias[1].dtype)
        u.param(0 if "bias" in op.attrs.get("tied", ()) else b_layout.local_numel(b_meta.shape, mesh))
        u.steps(st.db, "backward", "grad_bias")

    # Saved tensors.
    x_in_bytes, x_eff_bytes = local_bytes(x, plan.x_in, mesh), local_bytes(x, plan.x_eff, mesh)
    if plan.save_input == "in" or plan.x_in == plan.x_eff:
        u.save(tensor_key(op.inputs[0], plan.x_in), x_in_bytes)
    else:
        u.save(f"{op.name}:input:{plan.x_eff}", x_eff_bytes)
    w_gathered = bool(w_gather)
    if w_gathered and not plan.regather_weight:
        u.save(f"{op.name}:weight:{w_eff}", w_eff_bytes)

    # Transient buffers, per phase (temporaries alive together that nothing else counts), as layers3d's
    # ParallelLinear allocates them. Forward: a gathered input or weight that is not saved, and the
    # reduction of the partial output (the partial, the collective's staging and the reduced output:
    # cost_models.memory.conversion_working_set). Backward: dY as it arrives (and gathered), dX as the
    # matmul writes it and its reduction, and dW's buffers beyond the gradient autograd keeps, when dW is
    # transposed back (a weight stored (in, out), as HF Conv1D does), reduce-scattered or all-reduced
    # (layers3d.comm copies before reducing). Measured on HF GPT-2 tiny's MLP projection (replicated,
    # (128, 512) input): dY 65,536 + dX 262,144 + dW copy 262,144 B.
    y_eff_bytes, y_out_bytes = local_bytes(y, y_eff, mesh), local_bytes(y, plan.y_out, mesh)
    fwd = (x_eff_bytes if x_gather and plan.save_input == "in" else 0) \
        + (w_eff_bytes if w_gathered and plan.regather_weight else 0) \
        + conversion_working_set(y_reduce, y.shape, y.itemsize, mesh)
    dw_ar = bool(st.dw_reduce)
    # dW's chain: the matmul's result (and its transposed copy), its reduce-scatter to the stored shard, its
    # all-reduce copy; the last buffer is the gradient autograd keeps (counted with the states).
    dw_chain = max(2 * w_eff_bytes if op.attrs.get("weight_transposed") else w_eff_bytes,
                   conversion_working_set(backward_steps(list(w_gather), w_shape_nk, w_item, mesh), w_shape_nk,
                                          w_item, mesh) if w_gather else 0,
                   # a partial dW reduce-scattered onto the stored shard (measured: torch-cnn's fc under 2d,
                   # the whole dW, the copied send blocks and the shard at once)
                   conversion_working_set(st.dw_scatter, w_shape_nk, w_item, mesh),
                   2 * w_store_bytes if dw_ar else 0)
    dx_ws = (conversion_working_set(st.dx, x.shape, x.itemsize, mesh) or x_in_bytes) if input_grad else 0
    bwd = y_out_bytes + (y_eff_bytes if y_eff_bytes > y_out_bytes else 0) + dx_ws \
        + (x_eff_bytes if x_gather and plan.save_input == "in" else 0) \
        + (w_eff_bytes if w_gathered and plan.regather_weight else 0) \
        + max(0, dw_chain - w_store_bytes)
    u.temp(max(fwd, bwd))
    # beside the output: the partial and the reduction's staging (measured on HF GPT-2's row-parallel MLP
    # projection re-run in a checkpointed block: the matmul's partial and the all-reduce's copy, then the
    # biased output), a gathered input it does not keep, a re-gathered weight
    u.fwd_temp(fwd - (y_out_bytes if y_reduce else 0))

    # FLOPs (torch.utils.flop_counter: 2 m k n forward, twice that backward) and memory traffic.
    m_loc = plan.x_eff.local_numel(x.shape, mesh) // (x.shape[-1] // mesh.size(k_axes))
    k_loc = x.shape[-1] // mesh.size(k_axes)
    n_loc = y.shape[-1] // mesh.size(plan.w_eff[0])
    u.fwd_flops = 2 * m_loc * k_loc * n_loc + (m_loc * n_loc if bias else 0)
    u.bwd_flops = (4 if input_grad else 2) * m_loc * k_loc * n_loc + (m_loc * n_loc if bias else 0)
    traffic = x_eff_bytes + local_bytes(w_shape_nk, w_eff, mesh, x.itemsize) + y_eff_bytes
    u.fwd_bytes, u.bwd_bytes = traffic, 2 * traffic
    return u


# --- capture -----------------------------------------------------------------------------------------
def _attrs(call: Call, weight_transposed: bool, has_bias: bool) -> dict[str, Any]:
    return {"in_features": call.in_meta[0].shape[-1], "out_features": call.outputs[0].shape[-1],
            "has_bias": has_bias, "weight_transposed": weight_transposed}


def linear_call(call: Call) -> dict[str, Any] | None:
    """F.linear / aten.linear(x, W, b); aten.addmm(b, x, W); x @ W (matmul/mm/bmm of an activation by a
    2-d parameter). A weight stored [in, out] (HF Conv1D) is used as is, nn.Linear's [out, in] via W.t()."""
    if call.op == "linear":
        x, w, b = call.arg(0, "input"), call.arg(1, "weight"), call.arg(2, "bias")
        if not (isinstance(x, Act) and isinstance(w, Param)):
            return None
        # F.linear(x, W) computes x @ W^T with W stored [out, in]; given W.t() the stored weight is [in, out].
        return _attrs(call, weight_transposed=w.transposed, has_bias=b is not None)
    if call.op == "addmm":
        bias, x, w = call.arg(0, "input"), call.arg(1, "mat1"), call.arg(2, "mat2")
        if isinstance(x, Act) and isinstance(w, Param):
            return _attrs(call, weight_transposed=not w.transposed, has_bias=isinstance(bias, Param))
        return None
    a, b = call.arg(0, "input"), call.arg(1, "other")  # matmul, mm, bmm
    if isinstance(a, Act) and isinstance(b, Param) and len(b.shape) == 2:
        return _attrs(call, weight_transposed=not b.transposed, has_bias=False)
    return None


def _linear_module(m: Any) -> dict[str, Any]:
    """nn.Linear (weight [out, in]) or HF Conv1D (no in_features; weight [in, out])."""
    if hasattr(m, "in_features"):
        return {"in_features": m.in_features, "out_features": m.out_features, "has_bias": m.bias is not None,
                "weight_transposed": False}
    return {"in_features": m.weight.shape[0], "out_features": m.weight.shape[1], "has_bias": m.bias is not None,
            "weight_transposed": True}


@op_family("linear", ops=("linear", "addmm", "matmul", "mm", "bmm"), classify=linear_call,
           modules=("torch.nn.modules.linear.Linear", "transformers.pytorch_utils.Conv1D"),
           module_attrs=_linear_module, in_map=True, prices_params=True)
def linear_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """Offers every linear scheme the shapes allow (input candidates are not needed: a linear fixes the
    layout its input must arrive in, and the edge from the producer pays any conversion)."""
    wj, _ = _weight(op)
    bias = _bias(op)
    for item in op_linear_plans(op, mesh):
        if isinstance(item, str):
            yield item
            continue
        scheme, plan = item
        opts = scheme.options()
        if plan.interleave > 1:
            opts = {**opts, "interleave": plan.interleave}
        params = [(param_key(op, wj), matmul_param_layout(op, *plan.w_store, plan.interleave))]
        if bias is not None:
            params.append((param_key(op, bias[0]), plan.bias_layout))
        strategy = Strategy(scheme.name, (plan.x_in,), (plan.y_out,), tuple(params), make_options(**opts))
        yield strategy, linear_usage(op, plan, mesh)
