"""Shared pieces of the op-family rules: the hardware-independent cost record and layout helpers.

A rule (one function per op family, registered in `cost_models.strategies`) yields, for one op on one
mesh, every strategy it offers together with its `Usage` (what the strategy costs in elements, bytes,
FLOPs and collectives, before any hardware numbers), and a reason string for every variant it does not
offer. `op_cost` turns a `Usage` into an `OpCost` with a hardware profile.

Saved-tensor keys: "<node>:<layout>" names a tensor as it flows between ops (the output of node <node>
in that layout; the runtime converts a producer's output to one layout once and shares it among its
consumers), so two ops that save the same tensor count it once. Copies an op makes for itself (gathered
inputs, gathered weights, contiguous copies of transposed matmul operands, dropout masks) are keyed
"<op>:<what>:<layout>".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from itertools import combinations, permutations
from typing import Any

from cost_models.layout import Axes, Layout, fits, token_layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, TensorMeta
from cost_models.redistribution import Step
from cost_models.strategy import Collective, SavedTensor, Strategy

__all__ = ["Usage", "Offer", "Rule", "Candidates", "make_options", "axis_subsets", "ordered_pairs",
           "cube_permutations", "rest_axes", "token_layout", "local_bytes", "local_numel", "fits", "param_key", "input_candidates_for",
           "tensor_key", "default_candidates"]

Candidates = list[list[Layout]] | None


@dataclass
class Usage:
    """What one strategy costs one rank, before hardware numbers.

    fwd_flops / bwd_flops and fwd_bytes / bwd_bytes (device-memory traffic) feed the roofline per phase;
    dtype picks the peak; collectives are the op's own (forward and backward); notes are for people.
    buffer_bytes: buffers this rank holds (BatchNorm running statistics): model state that is neither
    trained nor optimised, counted at its own size.
    param_elems / largest_param_elems: the elements of the parameters this rank stores, in all and of the
    largest one (what a single-tensor optimizer step holds temporaries of: `cost_models.optimizer`).
    """

    mesh: Mesh
    dtype: str = "float32"
    param_elems: int = 0
    largest_param_elems: int = 0
    buffer_bytes: int = 0
    saved: list[SavedTensor] = field(default_factory=list)
    transient_bytes: int = 0
    fwd_extra_bytes: int = 0
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0
    collectives: list[Collective] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def collective(self, kind: str, axes: Axes, nbytes: int, phase: str, tag: str) -> None:
        """Record a collective; a group of one rank is a no-op and is not recorded."""
        if axes and self.mesh.size(axes) > 1:
            self.collectives.append(Collective(kind, tuple(axes), int(nbytes), phase, tag))

    def steps(self, steps: Iterable[Step], phase: str, tag: str) -> None:
        """Record the collectives of redistribution steps (local slices cost nothing)."""
        for s in steps:
            if s.is_collective:
                self.collective(s.kind, s.axes, s.bytes, phase, tag)

    def param(self, elems: int) -> None:
        """Record a parameter this rank stores, `elems` local elements (0 for one tied to another op's)."""
        self.param_elems += int(elems)
        self.largest_param_elems = max(self.largest_param_elems, int(elems))

    def save(self, key: str, nbytes: int) -> None:
        if nbytes > 0:
            self.saved.append(SavedTensor(key, int(nbytes)))

    def temp(self, nbytes: int) -> None:
        """A set of temporary buffers alive together: the transient is the largest such set."""
        self.transient_bytes = max(self.transient_bytes, int(nbytes))

    def fwd_temp(self, nbytes: int) -> None:
        """A set of buffers the forward holds beside the op's output and what it saves (an unreduced partial
        output and its collective's staging, a gathered input it does not keep, CPU dropout's product before
        the scaling): what a checkpointed block's recomputation adds at this op (`planner.plans.recompute`)."""
        self.fwd_extra_bytes = max(self.fwd_extra_bytes, int(nbytes))


Offer = tuple[Strategy, Usage]
# A rule: (op, mesh, input candidates or None, device kind) -> offers and reasons (str) for variants not offered.
Rule = Callable[[OpNode, Mesh, Candidates, str], Iterator[Offer | str]]


def make_options(**kw: Any) -> tuple[tuple[str, Any], ...]:
    """Strategy options as sorted (key, value) pairs, dropping None values."""
    return tuple(sorted((k, v) for k, v in kw.items() if v is not None))


# Symmetry reduction. Two mesh axes of the same size and the same link class (both inside a node, or
# both crossing nodes) are interchangeable: swapping them everywhere in a plan changes no cost. So the
# enumeration offers one representative of each set of interchangeable axis choices: for tensor-parallel
# groups, the first k axes of each class; for role tuples (2d, 3d), one representative axis per class in
# the first role and both orders of the others (consecutive 2D/3D layers swap their last two roles).
# This cuts a 3D mesh's linear strategies about threefold and the edge matrices about tenfold. Set
# REDUCE_SYMMETRY = False to enumerate every axis assignment (tests compare both).
REDUCE_SYMMETRY = True


def axis_classes(mesh: Mesh, axes: Iterable[str] | None = None) -> list[list[str]]:
    """`axes` (default: all, in mesh order) grouped into classes of interchangeable axes."""
    classes: dict[tuple[int, bool], list[str]] = {}
    for a in (mesh.axis_names if axes is None else axes):
        classes.setdefault((mesh.axis_size(a), mesh.is_intra_node((a,))), []).append(a)
    return list(classes.values())


def _canonical(mesh: Mesh, subset: Iterable[str]) -> bool:
    """True when `subset` takes, within each class, that class's first axes."""
    chosen = set(subset)
    for cls in axis_classes(mesh):
        k = sum(a in chosen for a in cls)
        if set(cls[:k]) != chosen & set(cls):
            return False
    return True


def axis_subsets(mesh: Mesh) -> list[Axes]:
    """Non-empty subsets of the mesh axes, each in mesh order (smallest subsets first); one per
    symmetry class when REDUCE_SYMMETRY."""
    names = mesh.axis_names
    subsets = [c for r in range(1, len(names) + 1) for c in combinations(names, r)]
    return [c for c in subsets if not REDUCE_SYMMETRY or _canonical(mesh, c)]


def ordered_pairs(mesh: Mesh) -> list[tuple[str, str]]:
    """Ordered pairs of distinct axes (2D roles); with REDUCE_SYMMETRY only pairs whose left-over
    (data-parallel) axes are canonical, each in both orders."""
    pairs = list(permutations(mesh.axis_names, 2))
    if not REDUCE_SYMMETRY:
        return pairs
    return [p for p in pairs if _canonical(mesh, [a for a in mesh.axis_names if a not in p])]


def cube_permutations(mesh: Mesh) -> list[tuple[str, str, str]]:
    """Orderings of three mesh axes of equal size (3D roles); with REDUCE_SYMMETRY the first role takes
    one representative axis per class of the trio and the other two roles come in both orders."""
    out = []
    for trio in combinations(mesh.axis_names, 3):
        if len({mesh.axis_size(a) for a in trio}) != 1:
            continue
        firsts = [cls[0] for cls in axis_classes(mesh, trio)] if REDUCE_SYMMETRY else list(trio)
        for first in firsts:
            rest = [a for a in trio if a != first]
            out.extend([(first, rest[0], rest[1]), (first, rest[1], rest[0])])
    return out


def rest_axes(mesh: Mesh, used: Iterable[str]) -> Axes:
    """The mesh axes not in `used`, in mesh order (a scheme's data-parallel axes)."""
    used = set(used)
    return tuple(a for a in mesh.axis_names if a not in used)


@cache
def local_numel(shape: tuple[int, ...], layout: Layout, mesh: Mesh) -> int:
    """`layout.local_numel(shape, mesh)`, memoised (costing a model asks for the same blocks many times)."""
    return layout.local_numel(shape, mesh)


def local_bytes(meta: TensorMeta | tuple[int, ...], layout: Layout, mesh: Mesh, itemsize: int | None = None) -> int:
    """Bytes of this rank's block of a tensor in `layout` (itemsize from the meta unless given)."""
    if isinstance(meta, TensorMeta):
        shape, size = meta.shape, meta.itemsize if itemsize is None else itemsize
    else:
        shape, size = tuple(meta), itemsize or 1
    return local_numel(tuple(shape), layout, mesh) * size


def tensor_key(producer: str, layout: Layout) -> str:
    """Saved-tensor key of the output of node `producer` as it flows in `layout`."""
    return f"{producer}:{layout}"


def param_key(op: OpNode, index: int) -> str:
    """The key of op.params[index] in Strategy.params: its role, or role + index when two params share
    a role."""
    role = op.params[index].role
    if sum(p.role == role for p in op.params) > 1:
        return f"{role}{index}"
    return role


def default_candidates(meta: TensorMeta, mesh: Mesh) -> list[Layout]:
    """Layouts a tensor may arrive in when the caller gives no candidates: replicated, dim 0 split over
    each subset of axes, and (for ndim >= 2) the last dim split over each subset."""
    nd = len(meta.shape)
    out = [Layout.replicated(nd)]
    if nd == 0:
        return out
    for axes in axis_subsets(mesh):
        for d in ((0, nd - 1) if nd >= 2 else (0,)):
            lay = Layout.shard(nd, d, axes)
            if lay.fits(meta.shape, mesh) and lay not in out:
                out.append(lay)
    return out


def input_candidates_for(op: OpNode, index: int, candidates: Candidates, mesh: Mesh) -> list[Layout]:
    """The candidate layouts of input `index`: the caller's (dropping partial sums, which no follow op
    takes) or the defaults."""
    if candidates is not None and index < len(candidates) and candidates[index]:
        return [c for c in candidates[index] if not c.partial]
    meta = op.input_meta[index] if index < len(op.input_meta) else op.out
    return default_candidates(meta, mesh)
