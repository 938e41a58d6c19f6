"""Run-time strides of dense tensors, computed as torch computes them, without torch.

Whether a reshape is a view or a copy, and so whether a tensor some op saves is a storage of its own,
depends on the memory order its input has at run time, not on its shape: `x.permute(...).reshape(...)`
copies unless the permutation undoes the order `x` was written in. A kernel that writes its output in its
input's order (CPU `scaled_dot_product_attention` writes the output with q's strides) makes that order
travel. These helpers follow torch's rules (ATen's `computeStride` for views) on plain tuples, so that the
cost model, which imports no torch, can tell.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["contiguous_strides", "dense_like", "is_contiguous", "view_strides"]

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
