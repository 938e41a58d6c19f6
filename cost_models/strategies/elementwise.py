"""Element-wise ops (add, mul, where, exp... with broadcasting) and reductions (sum, mean... over dims):
they run in their inputs' layout; a broadcast input's gradient and a reduction over a split dim need an
all-reduce. Each family is registered here with its capture patterns (`cost_models.family`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cost_models.calls import Act, Call, Param, is_scalar, norm_dim
from cost_models.family import op_family
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import FLOAT_DTYPES, OpNode
from cost_models.strategies.base import (
    Candidates,
    Offer,
    Usage,
    default_candidates,
    input_candidates_for,
    local_bytes,
    tensor_key,
)
from cost_models.strategies.follow import memory_bound_usage
from cost_models.strategies.views import broadcast_axes, lift_layout, restrict_layout
from cost_models.strategy import Strategy

__all__ = ["elementwise_rule", "elementwise_call", "reduction_rule", "reduction_call", "ELEMENTWISE_SAVES"]


# What autograd saves for backward, by op: "tensors" = every tensor input when there are two tensor
# operands (a tensor times a Python scalar saves nothing), "none", ("input", i) = the tensor at positional
# argument i (masked_fill's mask, where's condition), "output" = the result. Ops without a gradient
# (comparisons, logical ops) save nothing.
ELEMENTWISE_SAVES: dict[str, Any] = {
    "add": "none", "sub": "none", "rsub": "none", "neg": "none", "mul": "tensors", "div": "tensors",
    "masked_fill": ("input", 1), "where": ("input", 0), "pow": ("input", 0), "exp": "output", "log": ("input", 0),
    "sqrt": "output", "rsqrt": "output", "reciprocal": "output", "abs": ("input", 0), "square": ("input", 0),
    "sin": ("input", 0), "cos": ("input", 0), "clamp": ("input", 0), "maximum": "tensors", "minimum": "tensors",
    "floor_divide": "none", "remainder": "none", "eq": "none", "ne": "none", "lt": "none", "le": "none",
    "gt": "none", "ge": "none", "and": "none", "or": "none", "xor": "none", "not": "none", "bitwise_and": "none",
    "bitwise_or": "none", "bitwise_not": "none", "logical_and": "none", "logical_or": "none",
    "logical_not": "none",
}


def elementwise_call(call: Call) -> dict[str, Any]:
    """attrs: fn, saves (indices of the inputs autograd keeps), saves_output, scalar (the scalar operands)."""
    rule = ELEMENTWISE_SAVES[call.op]
    positional = list(call.args) + list(call.kwargs.values())
    operands = [a for a in positional if isinstance(a, (Act, Param))]
    saves: list[int] = []
    if rule == "tensors" and len(operands) >= 2:
        # x * y keeps each factor for the other's gradient; x * 0.5 keeps nothing.
        saves = [a.index for a in operands if isinstance(a, Act)]
    elif isinstance(rule, tuple):
        picked = call.arg(rule[1], {"masked_fill": "mask", "where": "condition"}.get(call.op, "input"))
        saves = [picked.index] if isinstance(picked, Act) else []
    scalars = tuple(v for v in positional if is_scalar(v))
    return {"fn": call.op, "saves": tuple(saves), "saves_output": rule == "output", "scalar": scalars}


@op_family("elementwise", ops=tuple(ELEMENTWISE_SAVES), classify=elementwise_call)
def elementwise_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """Element-wise ops with any number of tensor inputs (broadcasting allowed). Output candidates are the
    union of the inputs' candidates lifted to the output shape; every input is asked for in that layout
    (restricted to its own dims). A broadcast input's gradient is all-reduced over the axes splitting
    the dims it was broadcast over (inputs without a gradient, per the `grad_inputs` hint, are skipped). Saves the inputs listed in attrs["saves"], and its output when
    attrs["saves_output"]."""
    out_shape = op.out.shape
    pool: list[Layout] = []
    for i, meta in enumerate(op.input_meta):
        for lay in input_candidates_for(op, i, candidates, mesh):
            lifted = lift_layout(meta.shape, out_shape, lay)
            if lifted not in pool:
                pool.append(lifted)
    if not op.input_meta:
        pool = default_candidates(op.out, mesh)
    saves = tuple(op.attrs.get("saves", ()) or ())
    for out in pool:
        if not out.fits(out_shape, mesh):
            yield f"{out} does not fit output {out_shape}"
            continue
        ins = tuple(restrict_layout(out, m.shape, out_shape) for m in op.input_meta)
        if not all(lay.fits(m.shape, mesh) for lay, m in zip(ins, op.input_meta)):
            yield f"{out} does not fit every input"
            continue
        u = Usage(mesh, dtype=op.out.dtype)
        moved = sum(local_bytes(m, lay, mesh) for lay, m in zip(ins, op.input_meta)) + local_bytes(op.out, out, mesh)
        u.fwd_bytes, u.bwd_bytes = moved, 2 * moved
        u.fwd_flops = u.bwd_flops = out.local_numel(out_shape, mesh)
        if op.attrs.get("saves_output"):  # exp, sqrt, rsqrt...: the backward reads the result
            u.save(tensor_key(op.name, out), local_bytes(op.out, out, mesh))
        grads = op.attrs.get("grad_inputs") or tuple(m.dtype in FLOAT_DTYPES for m in op.input_meta)
        # Backward of a computing op (mul, div, pow...; add hands its gradient on unchanged): the output's
        # gradient and one fresh output-sized gradient per input that takes one, alive together (measured:
        # 3 x 262,144 B at LLaMA's SwiGLU product, its checkpointed peak on a replicated rank).
        n_grads = sum(1 for i, m in enumerate(op.input_meta) if i < len(grads) and grads[i] and m.dtype in FLOAT_DTYPES)
        if n_grads and op.attrs.get("fn") not in ("add", "sub"):
            u.temp((1 + n_grads) * local_bytes(op.out, out, mesh))
        kept = _kept_inputs(op, saves, grads)
        for i, (lay, m) in enumerate(zip(ins, op.input_meta)):
            if i in kept:
                u.save(tensor_key(op.inputs[i], lay), local_bytes(m, lay, mesh))
            if i < len(grads) and grads[i] and m.dtype in FLOAT_DTYPES:
                axes = broadcast_axes(out, m.shape, out_shape)
                u.collective("all_reduce", axes, local_bytes(m, lay, mesh), "backward", "grad_input")
        yield Strategy("follow", ins, (out,)), u


def _kept_inputs(op: OpNode, saves: tuple[int, ...], grads: tuple[bool, ...]) -> set[int]:
    """The inputs of `saves` autograd keeps: x * y keeps y only for x's gradient and x only for y's
    (q * cos with a table that carries no gradient keeps the table alone); x / y keeps y when either has
    a gradient and x only for y's."""
    fn = op.attrs.get("fn")
    if fn in ("mul", "div") and len(op.inputs) == 2 and len(grads) == 2:
        need = {0: grads[1], 1: grads[0] or (fn == "div" and grads[1])}
        return {i for i in saves if need.get(i, True)}
    return set(saves)


def reduction_call(call: Call) -> dict[str, Any]:
    """attrs: fn, dims (sorted, non-negative; every dim when none are given), keepdim."""
    nd = call.ndim()
    dims = call.arg(1, "dim")
    if not isinstance(dims, (int, list, tuple)) or (isinstance(dims, (list, tuple)) and not dims):
        dims = None  # sum(x), sum(x, dtype=...), amax(x, dim=[]): over all dims
    if dims is None:
        dims = tuple(range(nd))
    elif isinstance(dims, int):
        dims = (dims,)
    keepdim = call.arg(2, "keepdim", False)
    return {"fn": call.op, "dims": tuple(sorted(norm_dim(int(d), nd) for d in dims)), "keepdim": bool(keepdim)}


@op_family("reduction", ops=("sum", "mean", "amax", "amin", "prod", "logsumexp"), classify=reduction_call)
def reduction_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """sum / mean over attrs["dims"] (all dims when absent): kept dims keep their split; reduced dims that
    are split leave partial sums, all-reduced in forward (tag output) so the result is complete. Other
    reductions (amax, prod, logsumexp) need their reduced dims whole: the runtime all-reduces sums only."""
    x, out = op.input_meta[0], op.out
    nd = len(x.shape)
    dims = op.attrs.get("dims", op.attrs.get("dim"))
    reduced = set(range(nd)) if dims is None else {d % nd for d in ((dims,) if isinstance(dims, int) else dims)}
    keepdim = len(out.shape) == nd
    for lay in input_candidates_for(op, 0, candidates, mesh):
        out_dims = [() if d in reduced else lay.dims[d] for d in range(nd) if keepdim or d not in reduced]
        result = Layout(tuple(out_dims))
        axes = tuple(a for d in sorted(reduced) for a in lay.dims[d])
        if axes and op.attrs.get("fn", "sum") not in ("sum", "mean"):
            yield f"{op.attrs.get('fn')} over dims split over {''.join(axes)}"
            continue
        u = memory_bound_usage(op, mesh, lay, x, 1, passes=1)
        u.collective("all_reduce", axes, local_bytes(out, result, mesh), "forward", "output")
        yield Strategy("follow", (lay,), (result,)), u
