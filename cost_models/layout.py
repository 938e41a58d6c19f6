"""Layouts: how one tensor is spread over the mesh.

A `Layout` says, for each tensor dim, the ordered mesh axes that split it (outermost first: the rank's
block index along that dim is the mixed-radix number of its coordinates on those axes), and the axes on
which the local tensor is a pending partial sum. Every other axis holds a replica. It is DTensor's
`Shard`/`Replicate`/`Partial` written per tensor dim instead of per mesh axis, which makes nested splits
(a dim split over two axes, as 3D tensor parallelism needs) a first-class value.

`interleave` > 1 describes the output of a fused projection (q, k, v in one linear) whose last dim is
`interleave` equal segments, each split on its own: rank r holds block r of every segment, so a local
`split` into the segments gives each rank its own shard of q, k and v.

Layouts are frozen and hashable; `str(layout)` is short: `[xy, -, z]` is dim 0 split over x then y, dim 1
replicated, dim 2 split over z; a trailing `+P(x)` marks a partial sum over x; `~3` an interleave of 3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from cost_models.errors import PlannerError
from cost_models.mesh import Mesh

__all__ = ["Layout", "LayoutError", "caller_layout", "split_tokens", "fits", "token_layout"]

Axes = tuple[str, ...]


class LayoutError(PlannerError, ValueError):
    """A layout that does not fit a tensor's shape or the mesh."""


# (layout, global shape, mesh) -> local shape or the LayoutError it raises (see Layout.local_shape)
_LOCAL_SHAPES: dict[tuple, tuple[int, ...] | LayoutError] = {}
_LOCAL_SHAPES_MAX = 1 << 20


@dataclass(frozen=True)
class Layout:
    """Placement of one tensor on the mesh (see the module docstring)."""

    dims: tuple[Axes, ...]
    partial: Axes = ()
    interleave: int = 1

    def __post_init__(self) -> None:
        dims = tuple(tuple(d) for d in self.dims)
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "partial", tuple(self.partial))
        used = [a for d in dims for a in d] + list(self.partial)
        if len(used) != len(set(used)):
            raise LayoutError(f"a mesh axis appears twice in layout {self}")
        if self.interleave < 1:
            raise LayoutError(f"interleave must be >= 1, got {self.interleave}")
        # layouts are dictionary keys all over the planner: hash once
        object.__setattr__(self, "_hash", hash((dims, self.partial, self.interleave)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    # --- constructors --------------------------------------------------------------------------
    @classmethod
    def replicated(cls, ndim: int) -> Layout:
        return cls(((),) * ndim)

    @classmethod
    def shard(cls, ndim: int, dim: int, axes: Sequence[str]) -> Layout:
        """Split tensor dim `dim` over `axes`, replicate the rest."""
        dims: list[Axes] = [()] * ndim
        dims[dim] = tuple(axes)
        return cls(tuple(dims))

    # --- queries -------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.dims)

    def axes(self) -> Axes:
        """All mesh axes that split some dim, in dim order."""
        return tuple(a for d in self.dims for a in d)

    def is_replicated(self) -> bool:
        return not self.axes() and not self.partial

    def replicated_axes(self, mesh: Mesh) -> Axes:
        used = set(self.axes()) | set(self.partial)
        return tuple(a for a in mesh.axis_names if a not in used)

    def split_factor(self, dim: int, mesh: Mesh) -> int:
        return mesh.size(self.dims[dim])

    def local_shape(self, shape: Sequence[int], mesh: Mesh) -> tuple[int, ...]:
        """This rank's block shape for a tensor of global `shape`; raises LayoutError if a split
        does not divide its dim. Memoised: costing a model asks for the same blocks many times."""
        key = (self, tuple(shape), mesh)
        hit = _LOCAL_SHAPES.get(key)
        if hit is None:
            try:
                hit = self._local_shape(key[1], mesh)
            except LayoutError as e:
                hit = e
            if len(_LOCAL_SHAPES) > _LOCAL_SHAPES_MAX:
                _LOCAL_SHAPES.clear()
            _LOCAL_SHAPES[key] = hit
        if isinstance(hit, LayoutError):
            raise LayoutError(str(hit))
        return hit

    def _local_shape(self, shape: tuple[int, ...], mesh: Mesh) -> tuple[int, ...]:
        if len(shape) != self.ndim:
            raise LayoutError(f"layout {self} has {self.ndim} dims but the tensor has shape {tuple(shape)}")
        out = []
        for i, (n, axes) in enumerate(zip(shape, self.dims)):
            f = mesh.size(axes)
            unit = f * (self.interleave if i == self.ndim - 1 else 1)
            if n % unit:
                raise LayoutError(
                    f"dim {i} of size {n} cannot be split {f} ways over mesh axes {axes}"
                    + (f" in {self.interleave} segments" if unit != f else "")
                    + f" (layout {self}, mesh {mesh})"
                )
            out.append(n // f)
        return tuple(out)

    def fits(self, shape: Sequence[int], mesh: Mesh) -> bool:
        try:
            self.local_shape(shape, mesh)
        except LayoutError:
            return False
        return True

    def local_numel(self, shape: Sequence[int], mesh: Mesh) -> int:
        n = 1
        for s in self.local_shape(shape, mesh):
            n *= s
        return n

    # --- derived layouts -----------------------------------------------------------------------
    def with_dim(self, dim: int, axes: Sequence[str]) -> Layout:
        dims = list(self.dims)
        dims[dim] = tuple(axes)
        return Layout(tuple(dims), self.partial, self.interleave)

    def without_partial(self) -> Layout:
        return Layout(self.dims, (), self.interleave)

    # --- printing and JSON ---------------------------------------------------------------------
    def __str__(self) -> str:
        body = "[" + ", ".join("".join(d) if d else "-" for d in self.dims) + "]"
        if self.partial:
            body += "+P(" + "".join(self.partial) + ")"
        if self.interleave > 1:
            body += f"~{self.interleave}"
        return body

    def to_json(self) -> dict:
        out: dict = {"dims": [list(d) for d in self.dims]}
        if self.partial:
            out["partial"] = list(self.partial)
        if self.interleave > 1:
            out["interleave"] = self.interleave
        return out

    @classmethod
    def from_json(cls, data: dict) -> Layout:
        try:
            return cls(tuple(tuple(d) for d in data["dims"]), tuple(data.get("partial", ())),
                       int(data.get("interleave", 1)))
        except (KeyError, TypeError) as e:
            raise LayoutError(f"malformed layout {data!r}: {e}") from None


def split_tokens(shape: Sequence[int], n_token_dims: int, axes: Sequence[str], mesh: Mesh) -> tuple[Axes, ...] | None:
    """Spread `axes` (outermost first) over the leading `n_token_dims` dims of `shape`.

    Token dims (batch, then sequence) are treated as one flattened dim M = B*S: axes go to the batch dim
    while it still divides, the rest to the sequence dim, so that the mixed-radix block order of the
    flattened M is kept. Returns the per-dim axes for the token dims, or None when they do not divide.
    """
    result: list[list[str]] = [[] for _ in range(n_token_dims)]
    d = 0
    remaining = list(shape[:n_token_dims])
    for a in axes:
        q = mesh.axis_size(a)
        while d < n_token_dims and remaining[d] % q:
            d += 1
        if d >= n_token_dims:
            return None
        # Once an axis went to a later dim, earlier dims may not take more axes (block order).
        result[d].append(a)
        remaining[d] //= q
    return tuple(tuple(r) for r in result)


@cache
def fits(layout: Layout, shape: tuple[int, ...], mesh: Mesh) -> bool:
    """`layout.fits(shape, mesh)`, memoised."""
    return layout.fits(shape, mesh)


def token_layout(shape: tuple[int, ...], token_axes: Axes, mesh: Mesh, feature_axes: Axes = (),
                 seq_axes: Axes = (), interleave: int = 1) -> Layout | None:
    """Layout of an activation [*tokens, F]: tokens spread over `token_axes` (batch dim first, see
    `split_tokens`), then `seq_axes` appended on the last token dim (sequence parallelism), features over
    `feature_axes`. None when the splits do not divide the shape."""
    n_tok = len(shape) - 1
    if n_tok < 1:
        return None
    tok = split_tokens(shape, n_tok, token_axes, mesh)
    if tok is None:
        return None
    dims = list(tok)
    dims[-1] = dims[-1] + tuple(seq_axes)
    layout = Layout(tuple(dims) + (tuple(feature_axes),), interleave=interleave if feature_axes else 1)
    if not fits(layout, tuple(shape), mesh):
        return None
    if interleave > 1 and feature_axes and shape[-1] % (mesh.size(feature_axes) * interleave):
        return None
    return layout


def caller_layout(shape: Sequence[int], inputs: str, mesh: Mesh) -> Layout:
    """The layout in which the caller passes a graph input or receives a graph output: whole on every rank
    (`inputs="full"`), or, with `inputs="sharded"`, this rank's block of the batch dim over every mesh axis
    (a tensor whose first dim the ranks cannot share equally, or a scalar, stays whole). `apply_plan`
    converts to and from it; the memory model prices those conversions with the same layout."""
    nd = len(shape)
    if inputs == "full" or nd == 0 or shape[0] % mesh.world_size:
        return Layout.replicated(nd)
    return Layout.shard(nd, 0, mesh.axis_names)
