"""How layouts pass through shape ops: reshape, permute, broadcasting.

Each function returns the mapped layout, or a string saying why the layout cannot pass through (the
caller then does not offer that strategy; the producer's edge must convert first).

Reshape: input and output dims are grouped into the smallest runs with equal products. Within a group
the flattened index is row-major, so a split survives only as the *outermost* part of the group: a
split of an inner dim is allowed only when every dim before it in the group is fully split (local size
1). The group's axes, outermost first, are then laid onto the output dims of the group the same way:
onto the first output dim while it divides, moving on only once it is fully split. The block order
(mixed radix over the axes) is unchanged, so no data moves.
"""

from __future__ import annotations

from collections.abc import Sequence

from cost_models.layout import Axes, Layout
from cost_models.mesh import Mesh

__all__ = ["reshape_layout", "permute_layout", "lift_layout", "restrict_layout", "broadcast_axes"]


def _groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
    """Runs of dims of `a` and `b` with equal products (None when the sizes do not match)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) or j < len(b):
        gi: list[int] = []
        gj: list[int] = []
        pa = pb = 1
        if i < len(a):
            gi.append(i)
            pa *= a[i]
            i += 1
        if j < len(b):
            gj.append(j)
            pb *= b[j]
            j += 1
        while pa != pb:
            if pa < pb:
                if i >= len(a):
                    return None
                gi.append(i)
                pa *= a[i]
                i += 1
            else:
                if j >= len(b):
                    return None
                gj.append(j)
                pb *= b[j]
                j += 1
        groups.append((gi, gj))
    return groups


def reshape_layout(in_shape: Sequence[int], out_shape: Sequence[int], layout: Layout, mesh: Mesh) -> Layout | str:
    """The layout of reshape(in_shape -> out_shape) of a tensor in `layout` (see the module docstring)."""
    if layout.partial:
        return f"reshape of a partial sum {layout}"
    groups = _groups(in_shape, out_shape)
    if groups is None:
        return f"reshape {tuple(in_shape)} -> {tuple(out_shape)}: sizes differ"
    out_dims: list[Axes] = [()] * len(out_shape)
    last_in, last_out = len(in_shape) - 1, len(out_shape) - 1
    keep_interleave = False
    for gi, gj in groups:
        flat: list[str] = []
        for pos, d in enumerate(gi):
            axes = layout.dims[d]
            if axes and any(in_shape[e] // mesh.size(layout.dims[e]) != 1 for e in gi[:pos]):
                return (f"reshape {tuple(in_shape)} -> {tuple(out_shape)}: dim {d} split over "
                        f"{''.join(axes)} is not outermost in its merged dims")
            flat.extend(axes)
        if flat and not gj:
            return f"reshape drops split dims {gi}"
        pos, rem = 0, (out_shape[gj[0]] if gj else 1)
        assigned: list[list[str]] = [[] for _ in gj]
        for a in flat:
            q = mesh.axis_size(a)
            while rem % q:
                if rem != 1 or pos + 1 >= len(gj):
                    return (f"reshape {tuple(in_shape)} -> {tuple(out_shape)}: axis {a} ({q} ways) does not "
                            f"divide output dim {gj[pos]}")
                pos += 1
                rem = out_shape[gj[pos]]
            assigned[pos].append(a)
            rem //= q
        for d, axes in zip(gj, assigned):
            out_dims[d] = tuple(axes)
        if last_in in gi and gi == [last_in] and gj == [last_out] and in_shape[last_in] == out_shape[last_out]:
            keep_interleave = True
    if layout.interleave > 1 and not keep_interleave:
        if layout.dims[last_in]:
            return f"reshape of the interleaved ({layout.interleave} segments) split last dim of {layout}"
    out = Layout(tuple(out_dims), interleave=layout.interleave if keep_interleave else 1)
    if not out.fits(out_shape, mesh):
        return f"reshape result {out} does not fit {tuple(out_shape)}"
    return out


def permute_layout(layout: Layout, perm: Sequence[int]) -> Layout | str:
    """The layout of a tensor in `layout` permuted by `perm` (output dim k = input dim perm[k])."""
    if layout.partial:
        return f"permute of a partial sum {layout}"
    nd = layout.ndim
    perm = [p % nd for p in perm]
    inter = layout.interleave
    if inter > 1 and perm[-1] != nd - 1:
        if layout.dims[-1]:
            return f"permute moves the interleaved split last dim of {layout}"
        inter = 1
    return Layout(tuple(layout.dims[p] for p in perm), interleave=inter)


def _aligned(in_shape: Sequence[int], out_shape: Sequence[int]) -> list[int | None]:
    """For each input dim, the output dim it broadcasts against (right-aligned), or None."""
    off = len(out_shape) - len(in_shape)
    return [d + off if d + off >= 0 else None for d in range(len(in_shape))]


def lift_layout(in_shape: Sequence[int], out_shape: Sequence[int], layout: Layout) -> Layout:
    """An input's layout seen on the broadcast output shape (new and size-1 dims unsplit)."""
    dims: list[Axes] = [()] * len(out_shape)
    for d, od in enumerate(_aligned(in_shape, out_shape)):
        if od is not None and in_shape[d] == out_shape[od]:
            dims[od] = layout.dims[d]
    last_kept = bool(in_shape) and bool(out_shape) and in_shape[-1] == out_shape[-1] and bool(dims[-1])
    return Layout(tuple(dims), interleave=layout.interleave if last_kept else 1)


def restrict_layout(out_layout: Layout, in_shape: Sequence[int], out_shape: Sequence[int]) -> Layout:
    """The layout an input of `in_shape` needs so that it broadcasts against an output in `out_layout`."""
    dims: list[Axes] = []
    for d, od in enumerate(_aligned(in_shape, out_shape)):
        dims.append(out_layout.dims[od] if od is not None and in_shape[d] == out_shape[od] else ())
    last_kept = bool(in_shape) and in_shape[-1] == out_shape[-1]
    return Layout(tuple(dims), interleave=out_layout.interleave if last_kept and dims and dims[-1] else 1)


def broadcast_axes(out_layout: Layout, in_shape: Sequence[int], out_shape: Sequence[int]) -> Axes:
    """The axes splitting output dims that an input of `in_shape` is broadcast over: that input's
    gradient is a partial sum over them and must be all-reduced."""
    kept = {od for d, od in enumerate(_aligned(in_shape, out_shape)) if od is not None and in_shape[d] == out_shape[od]}
    return tuple(a for od, axes in enumerate(out_layout.dims) if od not in kept for a in axes)
