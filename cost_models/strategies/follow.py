"""Ops that run in their input's layout with one input: dropout, activation, softmax, contiguous (casts,
copies); graph inputs/outputs; and the `other` fallback. Each family is registered here with its capture
patterns (`cost_models.family`).

Each offers one strategy per usable input candidate (the producers' output layouts, or defaults). They
move no data of their own; what they cost is memory traffic and what autograd saves:
softmax its output, dropout a mask (1 byte per element on CUDA, the input's dtype on CPU), activations
their input (relu/tanh/sigmoid their output).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from cost_models.calls import Call, norm_dim
from cost_models.family import flops_per_elem, op_family
from cost_models.layout import Layout
from cost_models.memory import dropout_mask_itemsize
from cost_models.mesh import Mesh
from cost_models.ops import DTYPE_BYTES, OpNode, TensorMeta
from cost_models.strategies.base import (
    Candidates,
    Offer,
    Usage,
    default_candidates,
    input_candidates_for,
    local_bytes,
    tensor_key,
)
from cost_models.strategy import Strategy

__all__ = ["follow_unary_rule", "memory_bound_usage", "backward_pair", "dropout_rule", "activation_rule", "softmax_rule",
           "contiguous_rule", "io_rule", "other_rule", "ACTIVATIONS"]

_SAVES_OUTPUT = ("relu", "tanh", "sigmoid")


def memory_bound_usage(op: OpNode, mesh: Mesh, layout: Layout, meta: TensorMeta, per_elem: int = 1, passes: int = 2) -> Usage:
    """Memory-bound op over a tensor in `layout`: `passes` tensors of its size moved forward, twice
    that backward."""
    u = Usage(mesh, dtype=meta.dtype)
    nbytes = local_bytes(meta, layout, mesh)
    u.fwd_bytes, u.bwd_bytes = passes * nbytes, 2 * passes * nbytes
    u.fwd_flops = per_elem * layout.local_numel(meta.shape, mesh)
    u.bwd_flops = u.fwd_flops
    return u


def follow_unary_rule(op: OpNode, mesh: Mesh, candidates: Candidates,
                      save: Callable[[Usage, Layout], None] | None,
                      check: Callable[[Layout], str | None] | None = None) -> Iterator[Offer | str]:
    """A single-input op that keeps its input's layout: one strategy per candidate that `check` accepts
    (it returns the reason for one it does not). `save(usage, layout)` records what autograd keeps; None
    for a copy (no FLOPs, nothing saved)."""
    x = op.input_meta[0]
    for lay in input_candidates_for(op, 0, candidates, mesh):
        reason = check(lay) if check is not None else None
        if reason is not None:
            yield reason
            continue
        if not lay.fits(op.out.shape, mesh):
            yield f"{lay} does not fit output {op.out.shape}"
            continue
        u = memory_bound_usage(op, mesh, lay, x, flops_per_elem(op.kind))
        if save is None:
            u.fwd_flops = u.bwd_flops = 0
        else:
            save(u, lay)
        # type_as(other): `other` is read for its dtype only, so it may arrive in any layout
        yield Strategy("follow", (lay,) + (None,) * (len(op.inputs) - 1), (lay,)), u


def backward_pair(u: Usage, op: OpNode, lay: Layout, mesh: Mesh) -> None:
    """The working set of a computing element-wise op's backward (threshold_backward, gelu_backward,
    softmax_backward, dropout's grad * mask): the output's gradient and the fresh input gradient, alive
    together. Measured: 131,072 B for two (8, 32, 8, 8) fp32 tensors at relu's backward on a replicated
    torch-cnn rank, where it is the step's peak."""
    u.temp(local_bytes(op.out, lay, mesh) + local_bytes(op.input_meta[0], lay, mesh))


# --- the single-input families ------------------------------------------------------------------------
def _dropout_call(call: Call) -> dict[str, Any]:
    p, training = call.arg(1, "p", 0.5), call.arg(2, "training", call.arg(2, "train", True))
    return {"p": float(p), "training": bool(training)}


def _dropout_module(m: Any) -> dict[str, Any]:
    return {"p": float(m.p), "training": bool(m.training)}


# FLOPs per element: compare with the threshold, scale.
@op_family("dropout", ops=("dropout", "native_dropout"), classify=_dropout_call,
           modules=("torch.nn.modules.dropout.Dropout",), module_attrs=_dropout_module, flops_per_elem=2)
def dropout_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """attrs["p"], attrs["training"]: saves a mask when it drops anything."""
    x = op.input_meta[0]

    def save(u: Usage, lay: Layout) -> None:
        p = float(op.attrs.get("p", 0.5))
        if p > 0 and op.attrs.get("training", op.attrs.get("train", True)):
            u.save(f"{op.name}:mask:{lay}", lay.local_numel(x.shape, mesh) * dropout_mask_itemsize(x.dtype, device))
            backward_pair(u, op, lay, mesh)
            if device == "cpu":  # the CPU kernel multiplies by the noise, then scales into a new tensor
                u.fwd_temp(local_bytes(op.out, lay, mesh))
        else:
            u.notes.append("dropout with p=0 or in eval mode is the identity: nothing saved")
    yield from follow_unary_rule(op, mesh, candidates, save)


ACTIVATIONS = ("gelu", "relu", "silu", "tanh", "sigmoid", "mish", "elu", "leaky_relu", "hardswish", "softplus")


def _activation_call(call: Call) -> dict[str, Any]:
    approximate = call.kwargs.get("approximate", call.args[1] if call.op == "gelu" and len(call.args) > 1 else "none")
    return {"fn": call.op, "approximate": str(approximate)}


def _activation_module(m: Any) -> dict[str, Any]:
    return {"fn": type(m).__name__.lower(), "approximate": getattr(m, "approximate", "none")}


# FLOPs per element: gelu (tanh form), a handful of multiply-adds and a tanh.
@op_family("activation", ops=ACTIVATIONS, classify=_activation_call,
           modules=tuple(f"torch.nn.modules.activation.{c}" for c in ("GELU", "ReLU", "SiLU", "Tanh", "Sigmoid")),
           module_attrs=_activation_module, flops_per_elem=8)
def activation_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """gelu, relu, silu, tanh... (attrs["fn"]): saves its input (relu/tanh/sigmoid their output)."""
    fn = str(op.attrs.get("fn", op.target)).lower()
    saves_output = any(name in fn for name in _SAVES_OUTPUT) and "leaky" not in fn

    def save(u: Usage, lay: Layout) -> None:
        if saves_output:
            u.save(tensor_key(op.name, lay), local_bytes(op.out, lay, mesh))
        else:
            u.save(tensor_key(op.inputs[0], lay), local_bytes(op.input_meta[0], lay, mesh))
        backward_pair(u, op, lay, mesh)
    yield from follow_unary_rule(op, mesh, candidates, save)


def _softmax_call(call: Call) -> dict[str, Any]:
    nd = call.ndim()
    dim = call.arg(1, "dim")
    if dim is None:  # legacy implicit dim of F.softmax
        dim = 0 if nd in (0, 1, 3) else 1
    return {"dim": norm_dim(int(dim), nd), "log": "log" in call.op}


# FLOPs per element: max, subtract, exp, sum, divide.
@op_family("softmax", ops=("softmax", "log_softmax", "_softmax", "_log_softmax"), classify=_softmax_call,
           flops_per_elem=5, in_map=True)
def softmax_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """softmax / log_softmax over attrs["dim"], which must be unsplit; saves its output."""
    def check(lay: Layout) -> str | None:
        dim = op.attrs.get("dim", -1) % len(op.out.shape)
        return f"softmax over dim {dim} split over {''.join(lay.dims[dim])}" if lay.dims[dim] else None

    def save(u: Usage, lay: Layout) -> None:
        u.save(tensor_key(op.name, lay), local_bytes(op.out, lay, mesh))
        backward_pair(u, op, lay, mesh)
    yield from follow_unary_rule(op, mesh, candidates, save, check)


@op_family("contiguous", ops=("contiguous", "clone", "to", "_to_copy", "type", "type_as", "float", "half",
                              "bfloat16", "double", "alias", "detach", "lift_fresh_copy"))
def contiguous_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """.contiguous() / clone / casts that keep the shape: a copy, nothing saved."""
    yield from follow_unary_rule(op, mesh, candidates, None)


# --- graph inputs and outputs, and the fallback ---------------------------------------------------------
@op_family("input")
@op_family("output")
def io_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """Graph inputs may be loaded in any layout (each rank loads its block); outputs take what comes."""
    if op.kind == "input":
        for lay in default_candidates(op.out, mesh):
            yield Strategy("follow", (), (lay,)), Usage(mesh, dtype=op.out.dtype)
        return
    meta = op.input_meta[0] if op.input_meta else None
    if meta is None:
        yield Strategy("follow", (), (Layout(()),)), Usage(mesh)
        return
    if len(op.inputs) > 1:  # several outputs (loss and logits): each leaves in the layout it comes in
        yield Strategy("follow", (None,) * len(op.inputs), (Layout(()),)), Usage(mesh, dtype=meta.dtype)
        return
    for lay in input_candidates_for(op, 0, candidates, mesh):
        yield Strategy("follow", (lay,), (lay,)), Usage(mesh, dtype=meta.dtype)


@op_family("other")
def other_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """No cost model: every input replicated, every output replicated, memory and time not modelled."""
    ins = tuple(Layout.replicated(len(m.shape)) for m in op.input_meta)
    outs = tuple(Layout.replicated(len(m.shape)) for m in op.outputs) or (Layout(()),)
    u = Usage(mesh, dtype=op.outputs[0].dtype if op.outputs else "float32")
    u.notes.append(f"no cost model for {op.target or op.kind}: runs replicated; what it saves for backward is "
                   "not counted, its time is its memory traffic")
    nbytes = sum(m.numel * DTYPE_BYTES.get(m.dtype, 4) for m in list(op.input_meta) + list(op.outputs))
    u.fwd_bytes, u.bwd_bytes = nbytes, 2 * nbytes
    yield Strategy("replicate", ins, outs), u
