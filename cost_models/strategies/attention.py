"""Matmul of two activations (attention scores q @ k^T, attention @ values): batch dims split alike.

a [..., m, k] @ b [..., k, n] runs locally when the contracted dim k is split on neither operand, the
batch dims (heads, batch) of the two agree (a broadcast operand leaves its dim unsplit) and the axes of
a's m and b's n differ. The output takes the batch splits, a's m split and b's n split. Heads split over
the axes that split the hidden dim of the q/k/v projection therefore make both attention matmuls (and the
softmax between them, in follow.py) local per head group.

Offers, for every pair of candidates: the pair itself when compatible, and each candidate with the other
operand re-laid to match it (its k and free dim unsplit): the edge from that operand's producer pays the
conversion (e.g. all-gathering the keys of a sequence-split layout).

Gradients: dA = dY @ B^T sums over the output's free dim n (and any batch dim A broadcasts), dB = A^T @ dY
over m. An operand whose layout lacks an axis that splits the output (B's n split while A is replicated
over that axis, as when the value heads' features are split and the attention weights are not) gets only
its rank's share of that sum: its gradient is all-reduced over those axes in backward (tag grad_input),
unless it carries no gradient (the `grad_inputs` hint). Without it the forward is exact and the backward
into A silently drops the other ranks' terms.

Saves both operands; with the `copies_inputs` hint (a transposed operand) the saved tensor is the
matmul's own contiguous copy, keyed by the matmul.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cost_models.calls import Act, Call
from cost_models.compute import matmul_flops
from cost_models.family import op_family
from cost_models.layout import Axes, Layout, LayoutError
from cost_models.mesh import Mesh
from cost_models.ops import FLOAT_DTYPES, OpNode, TensorMeta
from cost_models.strategies.base import Candidates, Offer, Usage, input_candidates_for, local_bytes, tensor_key
from cost_models.strategy import Strategy

__all__ = ["matmul_rule", "matmul_call", "matmul_output", "matmul_grad_axes"]


def _batch_dims(meta: TensorMeta, out_nd: int) -> dict[int, int]:
    """Output batch dim -> this operand's dim, for the operand's batch dims of full size."""
    off = out_nd - len(meta.shape)
    return {d + off: d for d in range(len(meta.shape) - 2)}


def matmul_output(a: TensorMeta, b: TensorMeta, out: TensorMeta, la: Layout, lb: Layout) -> Layout | str:
    """The output layout of a @ b with operands in `la` / `lb`, or why they are incompatible."""
    if la.partial or lb.partial:
        return "matmul of a partial sum"
    if la.dims[-1] or lb.dims[-2]:
        return f"matmul contracted dim split ({la} @ {lb})"
    nd = len(out.shape)
    dims: list[Axes] = [()] * nd
    for meta, lay in ((a, la), (b, lb)):
        for od, d in _batch_dims(meta, nd).items():
            axes = lay.dims[d]
            if meta.shape[d] != out.shape[od]:
                if axes:
                    return f"broadcast batch dim {d} split ({lay})"
                continue
            if dims[od] and axes != dims[od]:
                return f"batch dim {od} split differently ({la} @ {lb})"
            dims[od] = axes
    # An operand that has a full batch dim the other splits must split it the same way.
    for meta, lay in ((a, la), (b, lb)):
        for od, d in _batch_dims(meta, nd).items():
            if meta.shape[d] == out.shape[od] and lay.dims[d] != dims[od]:
                return f"batch dim {od} split differently ({la} @ {lb})"
    dims[-2], dims[-1] = la.dims[-2], lb.dims[-1]
    try:
        return Layout(tuple(dims), interleave=lb.interleave if lb.dims[-1] else 1)
    except LayoutError as e:
        return str(e)


def matmul_grad_axes(out: Layout, lay: Layout) -> Axes:
    """The axes over which an operand in `lay` has a partial gradient when the output is in `out`: those
    splitting the output but not the operand (its gradient sums over the output dims they split)."""
    own = set(lay.axes())
    return tuple(a for axes in out.dims for a in axes if a not in own)


def _match(other: TensorMeta, out_nd: int, lay: Layout, lay_meta: TensorMeta) -> Layout:
    """`other` operand re-laid to match `lay` (of the operand `lay_meta`): same batch splits, its own
    contracted and free dims unsplit."""
    src = _batch_dims(lay_meta, out_nd)
    dims: list[Axes] = [()] * len(other.shape)
    for od, d in _batch_dims(other, out_nd).items():
        if od in src and lay_meta.shape[src[od]] == other.shape[d]:
            dims[d] = lay.dims[src[od]]
    return Layout(tuple(dims))


def _usage(op: OpNode, mesh: Mesh, la: Layout, lb: Layout, out: Layout) -> Usage:
    a, b, y = op.input_meta[0], op.input_meta[1], op.out
    u = Usage(mesh, dtype=y.dtype)
    ya = la.local_shape(a.shape, mesh)
    yb = lb.local_shape(b.shape, mesh)
    yl = out.local_shape(y.shape, mesh)
    batch = 1
    for s in yl[:-2]:
        batch *= s
    u.fwd_flops = matmul_flops(ya[-2], ya[-1], yb[-1], batch)
    u.bwd_flops = 2 * u.fwd_flops
    moved = local_bytes(a, la, mesh) + local_bytes(b, lb, mesh) + local_bytes(y, out, mesh)
    u.fwd_bytes, u.bwd_bytes = moved, 2 * moved
    copies = tuple(op.attrs.get("copies_inputs", ()) or ())
    for i, (meta, lay) in enumerate(((a, la), (b, lb))):
        key = f"{op.name}:in{i}:{lay}" if i < len(copies) and copies[i] else tensor_key(op.inputs[i], lay)
        u.save(key, local_bytes(meta, lay, mesh))
    grads = op.attrs.get("grad_inputs") or (True, True)
    for i, (meta, lay) in enumerate(((a, la), (b, lb))):
        if i < len(grads) and grads[i] and meta.dtype in FLOAT_DTYPES:
            u.collective("all_reduce", matmul_grad_axes(out, lay), local_bytes(meta, lay, mesh), "backward",
                         "grad_input")
    return u


def matmul_call(call: Call) -> dict[str, Any] | None:
    """matmul / mm / bmm of two activations; `transpose_b` when b is a permute swapping its last two dims
    (k^T in attention scores)."""
    a, b = call.arg(0, "input"), call.arg(1, "other")
    if not (isinstance(a, Act) and isinstance(b, Act)):
        return None
    prod = call.producers[b.index]
    nd = len(call.in_meta[b.index].shape)
    swapped = tuple(range(nd - 2)) + (nd - 1, nd - 2)
    transpose_b = prod.kind == "permute" and nd >= 2 and tuple(prod.attrs.get("dims", ())) == swapped
    return {"transpose_b": transpose_b}


@op_family("matmul", ops=("matmul", "mm", "bmm"), classify=matmul_call, in_map=True)
def matmul_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    a, b, y = op.input_meta[0], op.input_meta[1], op.out
    if len(a.shape) < 2 or len(b.shape) < 2:
        rep = (Layout.replicated(len(a.shape)), Layout.replicated(len(b.shape)))
        u = Usage(mesh, dtype=y.dtype)
        u.notes.append("matmul with a 1-d operand runs replicated")
        yield Strategy("follow", rep, (Layout.replicated(len(y.shape)),)), u
        return
    nd = len(y.shape)
    cand_a = input_candidates_for(op, 0, candidates, mesh)
    cand_b = input_candidates_for(op, 1, candidates, mesh)
    pairs: list[tuple[Layout, Layout]] = []
    for la in cand_a:
        pairs += [(la, lb) for lb in cand_b]
        pairs.append((la, _match(b, nd, la, a)))
    for lb in cand_b:
        pairs.append((_match(a, nd, lb, b), lb))
    seen: set[tuple[Layout, Layout]] = set()
    for la, lb in pairs:
        if (la, lb) in seen:
            continue
        seen.add((la, lb))
        if not (la.fits(a.shape, mesh) and lb.fits(b.shape, mesh)):
            continue
        out = matmul_output(a, b, y, la, lb)
        if isinstance(out, str):
            yield out
            continue
        if not out.fits(y.shape, mesh):
            yield f"output {out} does not fit {y.shape}"
            continue
        yield Strategy("follow", (la, lb), (out,)), _usage(op, mesh, la, lb, out)
