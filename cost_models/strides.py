"""Run-time strides of dense tensors, computed as torch computes them, without torch.

Whether a reshape is a view or a copy, and so whether a tensor some op saves is a storage of its own,
depends on the memory order its input has at run time, not on its shape: `x.permute(...).reshape(...)`
copies unless the permutation undoes the order `x` was written in. A kernel that writes its output in its
input's order (CPU `scaled_dot_product_attention` writes the output with q's strides) makes that order
travel. These helpers follow torch's rules (ATen's `computeStride` for views) on plain tuples, so that the
cost model, which imports no torch, can tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cost_models.ops import OpNode

__all__ = ["contiguous_strides", "dense_like", "index_map", "is_contiguous", "is_identity", "is_view", "op_name", "runtime_strides",
           "view_strides"]

Shape = Sequence[int]


def contiguous_strides(shape: Shape) -> tuple[int, ...]:
    """The strides of a fresh (row-major) tensor of `shape`."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def is_contiguous(shape: Shape, strides: Shape) -> bool:
    """torch's `is_contiguous`: size-1 dims may have any stride."""
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1:
            if s != expected:
                return False
            expected *= n
    return True


def dense_like(shape: Shape, strides: Shape) -> tuple[int, ...]:
    """The strides `torch.empty_like` gives a dense tensor with these strides: the same memory order,
    without gaps (dims ordered by stride, outermost first; ties keep the logical order)."""
    order = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
    out = [0] * len(shape)
    step = 1
    for d in reversed(order):
        out[d] = step
        step *= max(shape[d], 1)
    return tuple(out)


def view_strides(shape: Shape, strides: Shape, new_shape: Shape) -> tuple[int, ...] | None:
    """The strides of `x.view(new_shape)` for `x` of `shape` and `strides`, or None when torch cannot view
    it (`reshape` then copies into a contiguous tensor). ATen's `computeStride`."""
    if len(shape) == 0:
        return contiguous_strides(new_shape)
    numel = 1
    for n in shape:
        numel *= n
    if numel == 0:
        return contiguous_strides(new_shape)
    new = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = strides[d - 1]
                tensor_numel = view_numel = 1
    if view_d != -1:
        return None
    return tuple(new)


def index_map(index: object, in_nd: int) -> list[int | None] | None:
    """For a tensor index (a tuple of slices {"slice": ...}, ints and None), the input dim behind each
    output dim (None: a new size-1 dim); None when the index is not of that form (ellipsis, tensors: those
    copy, the rest are views)."""
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


def is_identity(op: OpNode) -> bool:
    """Whether the op returns its input tensor itself: an identity dropout (p = 0 or not training), a cast
    to the dtype it already has, `alias`."""
    if op.kind == "dropout":
        return float(op.attrs.get("p", 0.5)) == 0.0 or not op.attrs.get("training", True)
    if op.kind == "contiguous" and op.input_meta:
        name = op_name(op.target)
        return name == "alias" or (name in _CASTS and op.input_meta[0].dtype == op.out.dtype)
    return False


_CASTS = ("to", "type", "type_as", "float", "half", "bfloat16", "double")
_FOLLOW_ORDER = ("elementwise", "dropout", "activation", "contiguous")


def op_name(target: str) -> str:
    """The op's own name in a target string ("aten.to.dtype" -> "to", "Tensor.contiguous" -> "contiguous")."""
    parts = [p for p in target.split(".") if p and p not in ("aten", "torch", "Tensor", "F", "default")]
    return parts[0] if parts else target


def runtime_strides(name: str, by_name: Mapping[str, OpNode], device: str = "cpu",
                    memo: dict[str, tuple[int, ...] | None] | None = None) -> tuple[int, ...] | None:
    """The strides the output of op `name` has at run time, replaying torch's rules along the graph:
    permutes permute them, a reshape views when torch can (`view_strides`) and otherwise copies into a
    contiguous tensor, indexing with ints and slices keeps the indexed dims' strides, an expand gives its
    broadcast dims stride 0, identities keep their input's, element-wise ops, dropout, activations and
    casts write in their first input's memory order (`dense_like`), `contiguous` and every other op make a
    fresh contiguous tensor; scaled-dot-product attention writes in q's order on CPU and in
    [*batch, L, H, E] order on CUDA (measured with torch 2.13). None when unknown. `memo` (op -> strides)
    may be shared between calls on one graph for one device kind."""
    memo = {} if memo is None else memo
    chain: list[str] = []  # walk down to an op whose strides are known, then fill in upwards
    at: str | None = name
    while at is not None and at not in memo:
        chain.append(at)
        op = by_name.get(at)
        at = _source(op, by_name) if op is not None else None
    for n in reversed(chain):
        op = by_name.get(n)
        memo[n] = None if op is None or not op.outputs else _strides_of(op, memo, device, _source(op, by_name))
    return memo[name]


def _source(op: OpNode, by_name: Mapping[str, OpNode]) -> str | None:
    """The input whose memory order the op's output follows (its first, when that is a single-output op)."""
    if not op.inputs or op.inputs[0] not in by_name or len(by_name[op.inputs[0]].outputs) != 1:
        return None
    if op.kind in ("permute", "reshape", "getitem", "expand", "attention") + _FOLLOW_ORDER:
        return op.inputs[0]
    return None


def _strides_of(op: OpNode, memo: Mapping[str, tuple[int, ...] | None], device: str,
                src_name: str | None) -> tuple[int, ...] | None:
    shape = tuple(op.out.shape)
    if src_name is None:
        return contiguous_strides(shape)
    src = memo.get(src_name)
    x = tuple(op.input_meta[0].shape)
    if src is None:
        return None
    if op.kind == "permute":
        dims = tuple(op.attrs.get("dims", ()))
        return tuple(src[d] for d in dims) if len(dims) == len(src) else None
    if op.kind == "reshape":
        return view_strides(x, src, shape) or contiguous_strides(shape)
    if op.kind == "getitem":
        mapping = index_map(op.attrs.get("index"), len(x))
        if mapping is None or len(mapping) != len(shape):
            return None
        return tuple(1 if d is None else src[d] for d in mapping)
    if op.kind == "expand":
        lead = len(shape) - len(x)
        if lead < 0:
            return None
        return tuple(0 if d < lead or (x[d - lead] == 1 and shape[d] != 1) else src[d - lead]
                     for d in range(len(shape)))
    if op.kind == "attention":
        if device == "cpu":
            return dense_like(shape, src) if len(src) == len(shape) else None
        nd = len(shape)
        order = tuple(range(nd - 3)) + (nd - 2, nd - 3, nd - 1)
        stored = contiguous_strides([shape[d] for d in order])
        return tuple(stored[order.index(d)] for d in range(nd))
    if shape != x:
        return contiguous_strides(shape)
    if is_identity(op):
        return tuple(src)
    if op.kind == "contiguous" and op_name(op.target) == "contiguous":
        return src if is_contiguous(shape, src) else contiguous_strides(shape)
    return dense_like(shape, src)


def _merges(in_shape: Sequence[int], out_shape: Sequence[int]) -> bool:
    """Whether reshaping `in_shape` to `out_shape` merges two or more dims of size > 1 (needs contiguity)."""
    from cost_models.strategies.views import _groups  # here: the strategies import this module

    groups = _groups(list(in_shape), list(out_shape))
    return groups is None or any(sum(in_shape[d] > 1 for d in gi) > 1 for gi, _ in groups)


def is_view(op: OpNode, strides: tuple[int, ...] | None) -> bool:
    """Whether `op`'s output is a view (or the very tensor) of its first input, which has `strides` at run
    time (None: unknown; then only a reshape that merges no dims counts as a view)."""
    x = op.input_meta[0]
    if is_identity(op):
        return True
    if op.kind == "contiguous":
        return op_name(op.target) == "contiguous" and strides is not None and is_contiguous(x.shape, strides)
    if op.kind == "permute":
        return True
    if op.kind == "getitem":  # slices and ints index a view; tensor (advanced) indexing copies
        return index_map(op.attrs.get("index"), len(x.shape)) is not None
    if op.kind == "reshape":
        if strides is None:
            return not _merges(x.shape, op.out.shape)
        return view_strides(x.shape, strides, op.out.shape) is not None
    return False
