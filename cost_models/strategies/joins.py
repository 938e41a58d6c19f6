"""Shape ops that join, widen or reinterpret tensors: `cat` / `stack`, `expand` (GQA's repeat_kv) and the
complex views of rotary embeddings (`view_as_complex` / `view_as_real`). All run in their input's layout
with no communication: the dim they join or widen must be unsplit, every other dim keeps its split, so a
tensor split by heads (batch, tokens) stays split the same way through rotate_half's `cat`, the
`expand` + `reshape` of repeat_kv and the complex rotation.

Autograd: `cat` and `stack` save nothing (their backward slices the gradient); `expand` sums the gradient
over the widened dims, which are unsplit, so the sum is local; the complex views are views.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cost_models.calls import Act, Call, norm_dim
from cost_models.family import op_family
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode
from cost_models.strategies.base import Candidates, Offer, Usage, input_candidates_for, local_bytes
from cost_models.strategies.views import lift_layout
from cost_models.strategy import Strategy

__all__ = ["cat_rule", "cat_call", "expand_rule", "expand_call", "complex_view_rule", "complex_view_call"]


def _moved(op: OpNode, mesh: Mesh, ins: tuple[Layout | None, ...], out: Layout) -> Usage:
    """A copy: reads the inputs, writes the output; twice that backward."""
    u = Usage(mesh, dtype=op.out.dtype)
    moved = sum(local_bytes(m, lay, mesh) for m, lay in zip(op.input_meta, ins) if lay is not None)
    moved += local_bytes(op.out, out, mesh)
    u.fwd_bytes, u.bwd_bytes = moved, 2 * moved
    return u


def cat_call(call: Call) -> dict[str, Any] | None:
    """torch.cat / concat / concatenate / stack (tensors, dim) and aten.cat / aten.stack: every joined
    tensor an activation (a parameter or constant among them: not this family)."""
    tensors = call.arg(0, "tensors")
    if not isinstance(tensors, (list, tuple)) or not tensors or not all(isinstance(t, Act) for t in tensors):
        return None
    dim = int(call.arg(1, "dim", call.kwargs.get("axis", 0)))
    return {"dim": norm_dim(dim, len(call.outputs[0].shape)), "stack": call.op == "stack"}


@op_family("cat", ops=("cat", "concat", "concatenate", "stack"), classify=cat_call)
def cat_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """cat along attrs["dim"] (every input in one layout, that dim unsplit) or stack at attrs["dim"] of
    the output (a new unsplit dim)."""
    dim, stack = int(op.attrs.get("dim", 0)), bool(op.attrs.get("stack"))
    in_nd = len(op.out.shape) - (1 if stack else 0)
    # torch.cat skips 1-d empty tensors of any rank (HF OPT's empty key cache): they take any layout
    joined = [i for i, m in enumerate(op.input_meta) if not _skipped(m.shape, in_nd, stack)]
    joined = joined or list(range(len(op.input_meta)))
    pool: list[Layout] = []
    for i in joined:
        for lay in input_candidates_for(op, i, candidates, mesh):
            if lay not in pool:
                pool.append(lay)
    for lay in pool:
        if len(lay.dims) != in_nd:
            continue
        if not stack and lay.dims[dim]:
            yield f"cat along dim {dim} split over {''.join(lay.dims[dim])}"
            continue
        if not all(lay.fits(op.input_meta[i].shape, mesh) for i in joined):
            yield f"{lay} does not fit every input"
            continue
        if stack:
            dims = lay.dims[:dim] + ((),) + lay.dims[dim:]
            out = Layout(dims, interleave=lay.interleave if dim < in_nd and lay.dims[-1] else 1)
        else:
            out = lay
        if not out.fits(op.out.shape, mesh):
            yield f"{out} does not fit output {op.out.shape}"
            continue
        ins = tuple(lay if i in joined else None for i in range(len(op.input_meta)))
        yield Strategy("follow", ins, (out,)), _moved(op, mesh, ins, out)


def _skipped(shape: tuple[int, ...], nd: int, stack: bool) -> bool:
    """Whether torch.cat ignores an input of `shape` when joining `nd`-dim tensors: a 1-d empty one."""
    return not stack and nd != 1 and tuple(shape) == (0,)


def expand_call(call: Call) -> dict[str, Any] | None:
    """x.expand(*sizes) / x.expand_as(y) / torch.broadcast_to(x, shape) / aten.expand of an activation."""
    if not call.in_meta or not isinstance(call.arg(0, "input"), Act):
        return None
    return {"shape": call.outputs[0].shape}


@op_family("expand", ops=("expand", "expand_as", "broadcast_to"), classify=expand_call)
def expand_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """expand / broadcast_to: kept dims keep their split, new and widened (size-1) dims are unsplit."""
    x = op.input_meta[0]
    for lay in input_candidates_for(op, 0, candidates, mesh):
        out = lift_layout(x.shape, op.out.shape, lay)
        if set(out.axes()) != set(lay.axes()):
            yield f"expand widens a split dim of {lay}"
            continue
        yield Strategy("follow", (lay,), (out,)), Usage(mesh, dtype=op.out.dtype)


def complex_view_call(call: Call) -> dict[str, Any]:
    return {"fn": call.op}


@op_family("complex_view", ops=("view_as_complex", "view_as_real"), classify=complex_view_call)
def complex_view_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """view_as_complex: [..., n, 2] real -> [..., n] complex, the pair dim unsplit; view_as_real the
    inverse (the complex dim must not be interleaved)."""
    x = op.input_meta[0]
    to_complex = op.attrs.get("fn") == "view_as_complex"
    for lay in input_candidates_for(op, 0, candidates, mesh):
        if to_complex:
            if lay.dims[-1]:
                yield f"view_as_complex of a split pair dim ({lay})"
                continue
            out = Layout(lay.dims[:-1])
        else:
            if lay.interleave > 1 and lay.dims[-1]:
                yield f"view_as_real of an interleaved layout ({lay})"
                continue
            out = Layout(lay.dims + ((),))
        if not (lay.fits(x.shape, mesh) and out.fits(op.out.shape, mesh)):
            continue
        yield Strategy("follow", (lay,), (out,)), Usage(mesh, dtype=op.out.dtype)
