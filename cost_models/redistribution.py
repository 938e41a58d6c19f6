"""Redistribution: the collectives that turn a tensor of one layout into another.

`plan_redistribution` is the single source of truth for layout conversions: the cost model prices its
steps and `layers3d.redistribute` executes exactly these steps, so measured bytes equal predicted bytes
by construction.

Per tensor dim, the source and destination axis tuples share a prefix; the source's remaining (inner)
axes are all-gathered and the destination's remaining axes are sliced locally. A gather on one dim and a
slice of the same axes on another dim fuse into one all-to-all. Pending partial sums are all-reduced, or
reduce-scattered when the destination splits a dim over exactly those axes.

Gradients follow the *complete-gradient convention*: at op boundaries every gradient is complete (never a
partial sum) and laid out like its tensor. So the backward of an all-gather is a local slice, the
backward of a slice is an all-gather, an all-to-all's is the reverse all-to-all, an all-reduce's is
nothing and a reduce-scatter's is an all-gather. `backward_steps` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cost_models.layout import Axes, Layout, LayoutError
from cost_models.mesh import Mesh
from cost_models.strategy import COLLECTIVE_KINDS

__all__ = ["Step", "plan_redistribution", "backward_steps", "COLLECTIVE_KINDS"]



@dataclass(frozen=True)
class Step:
    """One step of a redistribution, executed on every rank.

    kind: "all_gather", "reduce_scatter", "all_reduce", "all_to_all" or "slice" (local, no communication).
    axes: the mesh axes of the group, outermost first (block order).
    dim: the tensor dim gathered / scattered / sliced (for all_to_all: the dim that gets gathered).
    dst_dim: all_to_all only: the dim that gets split.
    bytes: per-rank size of the collective's full buffer: the gathered output (all_gather), the unreduced
        input (reduce_scatter, all_reduce), the local tensor (all_to_all); 0 for a slice.
    interleave: segments of the last dim (see Layout.interleave) that gather/slice keep apart.
    before, after: the layouts around this step.
    """

    kind: str
    axes: Axes
    dim: int | None
    dst_dim: int | None
    bytes: int
    before: Layout
    after: Layout
    interleave: int = 1

    @property
    def is_collective(self) -> bool:
        return self.kind != "slice"

    def __str__(self) -> str:
        where = f" dim {self.dim}" if self.dim is not None else ""
        if self.kind == "all_to_all":
            where = f" dim {self.dim}->{self.dst_dim}"
        return f"{self.kind}({''.join(self.axes)}){where} {self.before}->{self.after}"


def _nbytes(shape: tuple[int, ...], layout: Layout, mesh: Mesh, itemsize: int) -> int:
    return layout.local_numel(shape, mesh) * itemsize


def _common_prefix(a: Axes, b: Axes) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def plan_redistribution(shape: tuple[int, ...], itemsize: int, src: Layout, dst: Layout, mesh: Mesh) -> list[Step]:
    """Forward steps that convert a tensor of global `shape` from `src` to `dst` (empty if equal)."""
    shape = tuple(shape)
    if src.ndim != len(shape) or dst.ndim != len(shape):
        raise LayoutError(f"layouts {src} -> {dst} do not match a tensor of shape {shape}")
    src.local_shape(shape, mesh)
    dst.local_shape(shape, mesh)
    if set(dst.partial) - set(src.partial):
        raise LayoutError(f"cannot create a partial sum on {dst.partial} by redistribution ({src} -> {dst})")
    if src == dst:
        return []
    ndim = len(shape)
    last = ndim - 1
    keep: list[int] = []
    for d in range(ndim):
        k = _common_prefix(src.dims[d], dst.dims[d])
        if d == last and src.interleave != dst.interleave and (src.dims[d] or dst.dims[d]):
            k = 0
        keep.append(k)
    gathers = {d: src.dims[d][keep[d]:] for d in range(ndim) if src.dims[d][keep[d]:]}
    slices = {d: dst.dims[d][keep[d]:] for d in range(ndim) if dst.dims[d][keep[d]:]}

    steps: list[Step] = []
    cur = src

    def push(kind: str, axes: Axes, dim: int | None, new: Layout, dst_dim: int | None = None) -> None:
        nonlocal cur
        if kind in ("all_gather",):
            nbytes = _nbytes(shape, new, mesh, itemsize)
        elif kind == "slice":
            nbytes = 0
        else:
            nbytes = _nbytes(shape, cur, mesh, itemsize)
        # A slice or scatter produces the new layout's segments (its input's last dim is unsplit or split alike).
        seg = new.interleave if kind in ("slice", "reduce_scatter") else cur.interleave
        interleave = seg if dim == last or dst_dim == last else 1
        steps.append(Step(kind, tuple(axes), dim, dst_dim, nbytes, cur, new, interleave))
        cur = new

    # 1. Pending partial sums: reduce-scatter into a dim the destination splits over exactly those
    #    axes (and that gathers nothing), else all-reduce.
    pending = tuple(a for a in src.partial if a not in dst.partial)
    if pending:
        target = next((d for d, ax in slices.items() if set(ax) == set(pending) and d not in gathers), None)
        if target is not None:
            seg = dst.interleave if target == last else cur.interleave  # scattering the last dim makes dst's segments
            new = Layout(cur.dims, tuple(a for a in cur.partial if a not in pending), seg)
            new = new.with_dim(target, cur.dims[target] + slices.pop(target))
            push("reduce_scatter", new.dims[target][keep[target]:], target, new)
        else:
            push("all_reduce", pending, None, Layout(cur.dims, tuple(a for a in cur.partial if a not in pending),
                                                      cur.interleave))

    # 2. A gather on dim i fused with a slice of the same axes on dim j: one all-to-all.
    interleaved = src.interleave > 1 or dst.interleave > 1
    for i in sorted(gathers):
        j = next((j for j in sorted(slices) if j != i and j not in gathers and slices[j] == gathers[i]
                  and not (interleaved and last in (i, j))), None)
        if j is None:
            continue
        axes = gathers.pop(i)
        slices.pop(j)
        new = cur.with_dim(i, cur.dims[i][: keep[i]]).with_dim(j, cur.dims[j] + axes)
        push("all_to_all", axes, i, new, dst_dim=j)

    # 3. Remaining gathers, innermost axes first within one collective per dim.
    for d, axes in sorted(gathers.items()):
        new = cur.with_dim(d, cur.dims[d][: keep[d]])
        if d == last:
            new = Layout(new.dims, new.partial, dst.interleave if not dst.dims[d][keep[d]:] else 1)
        push("all_gather", axes, d, new)

    # 4. Local slices.
    for d, axes in sorted(slices.items()):
        new = cur.with_dim(d, cur.dims[d] + axes)
        if d == last:
            new = Layout(new.dims, new.partial, dst.interleave)
        push("slice", axes, d, new)

    if cur != dst:
        # Interleave differences on a replicated last dim carry no data movement.
        if Layout(cur.dims, cur.partial) == Layout(dst.dims, dst.partial) and not dst.dims[last] and not cur.dims[last]:
            return steps
        raise AssertionError(f"redistribution planner ended at {cur}, wanted {dst}")
    return steps


def backward_steps(forward: list[Step], shape: tuple[int, ...], itemsize: int, mesh: Mesh) -> list[Step]:
    """The steps that carry the gradient back through `forward` (complete-gradient convention)."""
    out: list[Step] = []
    for s in reversed(forward):
        if s.kind == "all_gather":
            out.append(replace(s, kind="slice", bytes=0, before=s.after, after=s.before))
        elif s.kind == "slice":
            out.append(replace(s, kind="all_gather", before=s.after, after=s.before,
                               bytes=_nbytes(tuple(shape), s.before, mesh, itemsize)))
        elif s.kind == "all_to_all":
            out.append(replace(s, dim=s.dst_dim, dst_dim=s.dim, before=s.after, after=s.before,
                               bytes=_nbytes(tuple(shape), s.after, mesh, itemsize)))
        elif s.kind == "reduce_scatter":
            full = s.before.without_partial()
            out.append(replace(s, kind="all_gather", before=s.after, after=full,
                               bytes=_nbytes(tuple(shape), full, mesh, itemsize)))
        elif s.kind == "all_reduce":
            continue
        else:
            raise AssertionError(f"unknown step kind {s.kind}")
    return out
