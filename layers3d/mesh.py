"""DeviceMesh: the logical mesh of `cost_models.mesh.Mesh` bound to real torch.distributed groups.

One process group is created per non-empty *set* of mesh axes and per group of ranks over that set
(`Mesh.groups`), in the same order on every rank, so that any collective over any subset of axes has a
communicator. A group over axes given in another order (`("z", "x")` instead of `("x", "z")`) reuses the
communicator of the set; `layers3d.comm` reorders chunks in Python so that results follow the requested
order (first axis outermost), which is the block order of `cost_models.layout.Layout`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch.distributed as dist

from cost_models.mesh import Mesh
from layers3d.errors import MeshSetupError
from layers3d.inflight import tracked

__all__ = ["DeviceMesh"]

Axes = tuple[str, ...]


class DeviceMesh:
    """A `Mesh` over the default process group (any backend: gloo on CPU, NCCL on GPU).

    mesh: the logical description; its world size must equal the process group's.
    Attributes: `mesh`, `rank` (global rank), `coords` (this rank's coordinate per axis name).
    """

    def __init__(self, mesh: Mesh) -> None:
        if not dist.is_initialized():
            raise MeshSetupError("torch.distributed is not initialised; call dist.init_process_group(...) first")
        world = dist.get_world_size()
        if world != mesh.world_size:
            raise MeshSetupError(
                f"mesh {mesh} has {mesh.world_size} ranks but the process group has {world}; "
                f"pick a mesh shape whose product is {world}"
            )
        self.mesh = mesh
        self.rank = dist.get_rank()
        self.coords: dict[str, int] = mesh.coords(self.rank)
        # Set of axes (mesh order) -> (process group, members sorted by global rank).
        self._groups: dict[Axes, tuple[dist.ProcessGroup, list[int]]] = {}
        self._order_cache: dict[Axes, list[int]] = {}
        for k in range(1, len(mesh.axis_names) + 1):
            for axes in itertools.combinations(mesh.axis_names, k):
                for members in mesh.groups(axes):
                    with tracked("new_group", (), f"mesh {mesh} group over {''.join(axes)}: ranks {sorted(members)}"):
                        pg = dist.new_group(sorted(members))  # collective: every rank calls it, in this order
                    if self.rank in members:
                        self._groups[axes] = (pg, sorted(members))

    @classmethod
    def detached(cls, mesh: Mesh, rank: int = 0) -> DeviceMesh:
        """`mesh` as rank `rank` sees it, without process groups: layers can be built on it (on meta
        tensors, to check that a plan can be applied, outside torch.distributed); no collective can run."""
        self = cls.__new__(cls)
        self.mesh, self.rank, self.coords = mesh, rank, mesh.coords(rank)
        self._groups, self._order_cache = {}, {}
        return self

    # --- sizes and positions -------------------------------------------------------------------
    @property
    def axis_names(self) -> Axes:
        return self.mesh.axis_names

    def size(self, axes: Sequence[str]) -> int:
        """Ranks in one group over `axes` (1 for no axes)."""
        return self.mesh.size(tuple(axes))

    def group_rank(self, axes: Sequence[str]) -> int:
        """Index of this rank in its group over `axes`, ordered by those axes' coordinates (first axis
        outermost): the block index of this rank along a dim split over `axes`."""
        idx = 0
        for a in axes:
            idx = idx * self.mesh.axis_size(a) + self.coords[a]
        return idx

    def _key(self, axes: Sequence[str]) -> Axes:
        axes = tuple(axes)
        if len(set(axes)) != len(axes):
            raise MeshSetupError(f"mesh axes {axes} name an axis twice")
        for a in axes:
            self.mesh.axis_index(a)  # raises MeshError for unknown axes
        return tuple(a for a in self.mesh.axis_names if a in axes)

    def group(self, axes: Sequence[str]) -> dist.ProcessGroup:
        """The process group of this rank over the set `axes` (any order)."""
        key = self._key(axes)
        if not key:
            raise MeshSetupError("a group needs at least one mesh axis")
        if key not in self._groups:
            raise MeshSetupError(f"no process group over {key}: this DeviceMesh was built detached (no collectives)")
        return self._groups[key][0]

    def order(self, axes: Sequence[str]) -> list[int]:
        """order[p] = the process-group rank of the member at position p when the group over `axes` is
        ordered by the given axes (first outermost). Process groups number members by global rank."""
        axes = tuple(axes)
        if axes not in self._order_cache:
            key = self._key(axes)
            members = self._groups[key][1]
            fixed = {a: c for a, c in self.coords.items() if a not in axes}
            ordered = []
            for var in itertools.product(*(range(self.mesh.axis_size(a)) for a in axes)):
                ordered.append(self.mesh.rank_of({**fixed, **dict(zip(axes, var))}))
            self._order_cache[axes] = [members.index(r) for r in ordered]
        return self._order_cache[axes]

    def members(self, axes: Sequence[str]) -> list[int]:
        """Global ranks of this rank's group over the set `axes`, sorted."""
        return self._groups[self._key(axes)][1]

    def global_rank_at(self, axes: Sequence[str], position: int) -> int:
        """Global rank of the member at `position` of this rank's group over `axes` (requested order)."""
        key = self._key(axes)
        return self._groups[key][1][self.order(axes)[position]]

    def __repr__(self) -> str:
        coords = ",".join(f"{a}={c}" for a, c in self.coords.items())
        return f"DeviceMesh({self.mesh}, rank={self.rank}, {coords})"
