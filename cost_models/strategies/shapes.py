"""Shape ops: view/reshape, transpose/permute, split/chunk and indexing (getitem, slice, select). The
layout maps through them (`cost_models.strategies.views`); they move no data. Each family is registered
here with its capture patterns (`cost_models.family`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from cost_models.calls import Call, flat, norm_dim
from cost_models.family import op_family
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import FLOAT_DTYPES, OpNode
from cost_models.strategies.base import Candidates, Offer, Usage, input_candidates_for, local_bytes
from cost_models.strategies.views import permute_layout, reshape_layout
from cost_models.strategy import Strategy
from cost_models.strides import index_map

__all__ = ["reshape_rule", "permute_rule", "split_rule", "getitem_rule"]


def _mapped(op: OpNode, mesh: Mesh, candidates: Candidates,
            out_layout: Callable[[Layout], Layout | str]) -> Iterator[Offer | str]:
    """A view whose output layout `out_layout` maps from its input's (or says why it cannot)."""
    for lay in input_candidates_for(op, 0, candidates, mesh):
        out = out_layout(lay)
        if isinstance(out, str):
            yield out
            continue
        yield Strategy("follow", (lay,), (out,)), Usage(mesh, dtype=op.out.dtype)


def _reshape_call(call: Call) -> dict[str, Any]:
    return {"shape": call.outputs[0].shape}


@op_family("reshape", ops=("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze",
                           "view_as", "reshape_as"), classify=_reshape_call)
def reshape_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """view / reshape / flatten... (attrs["shape"]: the output shape): splits map through merged and split
    dims when the split stays outermost."""
    x = op.input_meta[0]
    yield from _mapped(op, mesh, candidates, lambda lay: reshape_layout(x.shape, op.out.shape, lay, mesh))


def _permute_call(call: Call) -> dict[str, Any]:
    nd = call.ndim()
    dims = list(range(nd))
    if call.op == "permute":  # x.permute(0, 2, 1, 3), torch.permute(x, dims), aten.permute(x, dims)
        rest = call.args[1:] if len(call.args) > 1 else (call.kwargs.get("dims"),)
        dims = [norm_dim(int(d), nd) for d in flat(list(rest))]
    elif call.op == "T":
        dims.reverse()
    elif nd >= 2:
        if call.op == "t":
            d0, d1 = 0, 1
        elif call.op == "mT":
            d0, d1 = nd - 2, nd - 1
        else:
            d0, d1 = norm_dim(int(call.arg(1, "dim0")), nd), norm_dim(int(call.arg(2, "dim1")), nd)
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return {"dims": tuple(dims)}


@op_family("permute", ops=("permute", "transpose", "t", "swapaxes", "swapdims", "T", "mT"), classify=_permute_call)
def permute_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """transpose / permute (attrs["dims"]: the permutation): the splits move with their dims."""
    yield from _mapped(op, mesh, candidates, lambda lay: permute_layout(lay, op.attrs["dims"]))


def _split_call(call: Call) -> dict[str, Any]:
    dim = norm_dim(int(call.arg(2, "dim", 0)), call.ndim())
    return {"dim": dim, "sizes": tuple(o.shape[dim] for o in call.outputs)}


@op_family("split", ops=("split", "split_with_sizes", "chunk", "tensor_split"), classify=_split_call)
def split_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """split / chunk along attrs["dim"]: the split dim must be unsplit, except the last dim of an
    interleaved layout cut into exactly its segments (a fused q/k/v output), whose parts keep the split."""
    x = op.input_meta[0]
    nd = len(x.shape)
    dim = op.attrs.get("dim", 0) % nd
    parts = len(op.outputs)
    equal = len({o.shape[dim] for o in op.outputs}) == 1
    for lay in input_candidates_for(op, 0, candidates, mesh):
        split_last = dim == nd - 1 and bool(lay.dims[-1])
        if split_last and not (lay.interleave == parts and equal):
            yield f"split of dim {dim} split over {''.join(lay.dims[dim])} (interleave {lay.interleave}, {parts} parts)"
            continue
        if dim != nd - 1 and lay.dims[dim]:
            yield f"split of dim {dim} split over {''.join(lay.dims[dim])}"
            continue
        inter = 1 if dim == nd - 1 or not lay.dims[-1] else lay.interleave
        out = Layout(lay.dims, interleave=inter)
        if not all(out.fits(o.shape, mesh) for o in op.outputs):
            yield f"parts of {lay} do not divide"
            continue
        u = Usage(mesh, dtype=x.dtype)
        # Backward: autograd holds the gradients of the parts until all have arrived (together the input's
        # size) and concatenates them into a new tensor of the input's size: twice the input, alive at once.
        u.temp(2 * local_bytes(x, lay, mesh))
        yield Strategy("follow", (lay,), (out,) * parts), u


def _getitem_call(call: Call) -> dict[str, Any]:
    """x[index] and item `index` of a multi-output op; aten.slice / aten.select as the index they take."""
    if call.op == "slice":  # aten.slice(x, dim, start, end, step) == x[(:,) * dim + (start:end:step,)]
        dim = norm_dim(int(call.arg(1, "dim", 0)), call.ndim())
        return {"index": (slice(None),) * dim + (slice(call.arg(2, "start"), call.arg(3, "end"), call.arg(4, "step", 1)),)}
    if call.op == "select":
        dim = norm_dim(int(call.arg(1, "dim")), call.ndim())
        return {"index": (slice(None),) * dim + (int(call.arg(2, "index")),)}
    return {"index": call.args[1]}


def _indexing_usage(op: OpNode, mesh: Mesh, lay: Layout, o_lay: Layout) -> Usage:
    """Indexing a tensor (x[i], select, slice) moves no data forward; its backward (select_backward,
    slice_backward) writes the output's gradient into a zero-filled gradient of the whole input: both
    alive at once."""
    x, out = op.input_meta[0], op.out
    if x.dtype not in FLOAT_DTYPES:
        return Usage(mesh, dtype=out.dtype)
    u = Usage(mesh, dtype=out.dtype)
    u.temp(local_bytes(x, lay, mesh) + local_bytes(out, o_lay, mesh))
    return u


@op_family("getitem", ops=("getitem", "slice", "select"), classify=_getitem_call)
def getitem_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """Item `index` (an int) of a multi-output op, whose candidates are those of that output: identity.
    Indexing a tensor with slices / ints / None: kept dims keep their split, a dim that is sliced to
    another size or selected away must be unsplit; other indexing runs replicated."""
    out = op.out
    x = op.input_meta[0] if op.input_meta else out
    index = op.attrs.get("index")
    tuple_item = isinstance(index, int) and not isinstance(index, bool) and x.shape == out.shape
    mapping = None if tuple_item else index_map(index, len(x.shape))
    for lay in input_candidates_for(op, 0, candidates, mesh):
        if tuple_item:
            yield Strategy("follow", (lay,), (lay,)), Usage(mesh, dtype=out.dtype)
            continue
        if mapping is None or len(mapping) != len(out.shape) or lay.partial:
            rep_in, rep_out = Layout.replicated(len(x.shape)), Layout.replicated(len(out.shape))
            yield Strategy("follow", (rep_in,), (rep_out,)), _indexing_usage(op, mesh, rep_in, rep_out)
            continue
        kept = {d: od for od, d in enumerate(mapping) if d is not None}
        bad = [d for d in range(len(x.shape)) if lay.dims[d] and (d not in kept or x.shape[d] != out.shape[kept[d]])]
        if bad:
            yield f"indexing changes dims {bad} split in {lay}"
            continue
        dims = tuple(lay.dims[d] if d is not None else () for d in mapping)
        last_kept = bool(mapping) and mapping[-1] == len(x.shape) - 1 and bool(dims[-1])
        o_lay = Layout(dims, interleave=lay.interleave if last_kept else 1)
        yield Strategy("follow", (lay,), (o_lay,)), _indexing_usage(op, mesh, lay, o_lay)
