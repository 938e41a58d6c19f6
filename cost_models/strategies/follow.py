"""Ops that run in their input's layout: element-wise, dropout, activation, softmax, shape ops, casts,
reductions, graph inputs/outputs, and the `other` fallback.

Each offers one strategy per usable input candidate (the producers' output layouts, or defaults). They
move no data of their own; what they cost is memory traffic and what autograd saves:
softmax its output, dropout a mask (1 byte per element on CUDA, the input's dtype on CPU), activations
their input (relu/tanh/sigmoid their output), element-wise ops the inputs listed in attrs["saves"].
"""

from __future__ import annotations

from collections.abc import Iterator

from cost_models.compute import FLOPS_PER_ELEM
from cost_models.layout import Layout
from cost_models.memory import dropout_mask_itemsize
from cost_models.mesh import Mesh
from cost_models.ops import DTYPE_BYTES, OpNode, TensorMeta
from cost_models.strategies import register
from cost_models.strategies.base import (
    Candidates,
    Offer,
    Usage,
    default_candidates,
    input_candidates_for,
    local_bytes,
    tensor_key,
)
from cost_models.strategies.views import broadcast_axes, lift_layout, permute_layout, reshape_layout, restrict_layout
from cost_models.strategy import Strategy

__all__ = ["follow_unary_rule", "elementwise_rule", "shape_rule", "split_rule", "getitem_rule", "reduction_rule",
           "io_rule", "other_rule"]

_FLOAT = ("float16", "bfloat16", "float32", "float64")
_SAVES_OUTPUT = ("relu", "tanh", "sigmoid")


def _usage(op: OpNode, mesh: Mesh, layout: Layout, meta: TensorMeta, per_elem: int = 1, passes: int = 2) -> Usage:
    """Memory-bound op over a tensor in `layout`: `passes` tensors of its size moved forward, twice
    that backward."""
    u = Usage(mesh, dtype=meta.dtype)
    nbytes = local_bytes(meta, layout, mesh)
    u.fwd_bytes, u.bwd_bytes = passes * nbytes, 2 * passes * nbytes
    u.fwd_flops = per_elem * layout.local_numel(meta.shape, mesh)
    u.bwd_flops = u.fwd_flops
    return u


def _unary_out(op: OpNode, layout: Layout) -> Layout | str:
    if op.kind == "softmax":
        dim = op.attrs.get("dim", -1) % len(op.out.shape)
        if layout.dims[dim]:
            return f"softmax over dim {dim} split over {''.join(layout.dims[dim])}"
    return layout


@register("dropout", "activation", "softmax", "contiguous")
def follow_unary_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """Single-input ops that keep their input's layout (softmax needs its dim unsplit)."""
    x = op.input_meta[0]
    for lay in input_candidates_for(op, 0, candidates, mesh):
        out = _unary_out(op, lay)
        if isinstance(out, str):
            yield out
            continue
        if not lay.fits(op.out.shape, mesh):
            yield f"{lay} does not fit output {op.out.shape}"
            continue
        u = _usage(op, mesh, lay, x, FLOPS_PER_ELEM.get(op.kind, 1))
        if op.kind == "dropout":
            p = float(op.attrs.get("p", 0.5))
            if p > 0 and op.attrs.get("training", op.attrs.get("train", True)):
                u.save(f"{op.name}:mask:{lay}", lay.local_numel(x.shape, mesh) * dropout_mask_itemsize(x.dtype, device))
            else:
                u.notes.append("dropout with p=0 or in eval mode is the identity: nothing saved")
        elif op.kind == "activation":
            fn = str(op.attrs.get("fn", op.target)).lower()
            if any(name in fn for name in _SAVES_OUTPUT) and "leaky" not in fn:
                u.save(tensor_key(op.name, out), local_bytes(op.out, out, mesh))
            else:
                u.save(tensor_key(op.inputs[0], lay), local_bytes(x, lay, mesh))
        elif op.kind == "softmax":
            u.save(tensor_key(op.name, out), local_bytes(op.out, out, mesh))
        else:  # contiguous / cast: a copy, nothing saved
            u.fwd_flops = u.bwd_flops = 0
        yield Strategy("follow", (lay,), (out,)), u


@register("elementwise")
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
        grads = op.attrs.get("grad_inputs") or tuple(m.dtype in _FLOAT for m in op.input_meta)
        for i, (lay, m) in enumerate(zip(ins, op.input_meta)):
            if i in saves:
                u.save(tensor_key(op.inputs[i], lay), local_bytes(m, lay, mesh))
            if i < len(grads) and grads[i] and m.dtype in _FLOAT:
                axes = broadcast_axes(out, m.shape, out_shape)
                u.collective("all_reduce", axes, local_bytes(m, lay, mesh), "backward", "grad_input")
        yield Strategy("follow", ins, (out,)), u


def _shape_out(op: OpNode, lay: Layout, mesh: Mesh) -> Layout | str:
    x = op.input_meta[0]
    if op.kind == "permute":
        return permute_layout(lay, op.attrs["dims"])
    return reshape_layout(x.shape, op.out.shape, lay, mesh)


@register("reshape", "permute")
def shape_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """view / reshape / flatten and transpose / permute: the layout maps through (module views)."""
    for lay in input_candidates_for(op, 0, candidates, mesh):
        out = _shape_out(op, lay, mesh)
        if isinstance(out, str):
            yield out
            continue
        yield Strategy("follow", (lay,), (out,)), Usage(mesh, dtype=op.out.dtype)


@register("split")
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


def _index_map(index: object, in_nd: int) -> list[int | None] | None:
    """For a tensor index (a tuple of slices {"slice": ...}, ints and None), the input dim behind each
    output dim (None: a new size-1 dim); None when the index is not of that form (ellipsis, tensors)."""
    entries = index if isinstance(index, tuple) else (index,)
    out: list[int | None] = []
    d = 0
    for e in entries:
        if e is None:
            out.append(None)
        elif isinstance(e, dict) and "slice" in e:
            out.append(d)
            d += 1
        elif isinstance(e, int) and not isinstance(e, bool):
            d += 1
        else:
            return None
    if d > in_nd:
        return None
    return out + list(range(d, in_nd))


@register("getitem")
def getitem_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """Item `index` (an int) of a multi-output op, whose candidates are those of that output: identity.
    Indexing a tensor with slices / ints / None: kept dims keep their split, a dim that is sliced to
    another size or selected away must be unsplit; other indexing runs replicated."""
    out = op.out
    x = op.input_meta[0] if op.input_meta else out
    index = op.attrs.get("index")
    tuple_item = isinstance(index, int) and not isinstance(index, bool) and x.shape == out.shape
    mapping = None if tuple_item else _index_map(index, len(x.shape))
    for lay in input_candidates_for(op, 0, candidates, mesh):
        if tuple_item:
            yield Strategy("follow", (lay,), (lay,)), Usage(mesh, dtype=out.dtype)
            continue
        if mapping is None or len(mapping) != len(out.shape) or lay.partial:
            rep_in, rep_out = Layout.replicated(len(x.shape)), Layout.replicated(len(out.shape))
            yield Strategy("follow", (rep_in,), (rep_out,)), Usage(mesh, dtype=out.dtype)
            continue
        kept = {d: od for od, d in enumerate(mapping) if d is not None}
        bad = [d for d in range(len(x.shape)) if lay.dims[d] and (d not in kept or x.shape[d] != out.shape[kept[d]])]
        if bad:
            yield f"indexing changes dims {bad} split in {lay}"
            continue
        dims = tuple(lay.dims[d] if d is not None else () for d in mapping)
        last_kept = bool(mapping) and mapping[-1] == len(x.shape) - 1 and bool(dims[-1])
        yield Strategy("follow", (lay,), (Layout(dims, interleave=lay.interleave if last_kept else 1),)), \
            Usage(mesh, dtype=out.dtype)


@register("reduction")
def reduction_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """sum / mean over attrs["dims"] (all dims when absent): kept dims keep their split; reduced dims that
    are split leave partial sums, all-reduced in forward (tag output) so the result is complete. Other
    reductions (amax, prod, logsumexp) need their reduced dims whole."""
    x, out = op.input_meta[0], op.out
    nd = len(x.shape)
    dims = op.attrs.get("dims", op.attrs.get("dim"))
    reduced = set(range(nd)) if dims is None else {d % nd for d in ((dims,) if isinstance(dims, int) else dims)}
    keepdim = len(out.shape) == nd
    for lay in input_candidates_for(op, 0, candidates, mesh):
        out_dims = [() if d in reduced else lay.dims[d] for d in range(nd) if keepdim or d not in reduced]
        result = Layout(tuple(out_dims))
        axes = tuple(a for d in sorted(reduced) for a in lay.dims[d])
        if axes and op.attrs.get("fn", "sum") not in ("sum", "mean"):  # the runtime all-reduces sums only
            yield f"{op.attrs.get('fn')} over dims split over {''.join(axes)}"
            continue
        u = _usage(op, mesh, lay, x, 1, passes=1)
        u.collective("all_reduce", axes, local_bytes(out, result, mesh), "forward", "output")
        yield Strategy("follow", (lay,), (result,)), u


@register("input", "output")
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


@register("other")
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
