"""The device mesh as the cost model sees it: N ranks arranged as a grid with named axes.

The last axis varies fastest (rank = ... + coord[-2] * shape[-1] + coord[-1]), so it is the axis that
stays inside a node. A *group* of axes (any subset) is a set of communicators: the ranks that differ only
in those axes' coordinates. Collectives run over groups; their cost depends on whether the group stays
inside one node.

This module is pure description: no process groups. `layers3d.mesh.DeviceMesh` builds the real
communicators from the same description.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from cost_models.errors import PlannerError

__all__ = ["Mesh", "MeshError", "AXIS_NAMES", "MAX_WORLD_SIZE", "candidate_meshes", "check_world_size",
           "prime_factors"]

AXIS_NAMES = ("x", "y", "z", "w")
# The most ranks a mesh may have: 2**24 (16,777,216) is over 100 times the largest GPU clusters built (about
# 10**5 GPUs), and keeps every per-rank count of the planner (groups, collective sizes) small and fast.
MAX_WORLD_SIZE = 2**24


class MeshError(PlannerError, ValueError):
    """A mesh that cannot be built from the given numbers (names the factor that is wrong)."""


@dataclass(frozen=True)
class Mesh:
    """A logical grid of ranks.

    shape: size of each mesh axis, outermost first; the product is the world size.
    axis_names: one short name per axis ("x", "y", "z" by default).
    ranks_per_node: ranks that share a fast intra-node interconnect (NVLink).
    """

    shape: tuple[int, ...]
    axis_names: tuple[str, ...] = ()
    ranks_per_node: int = 8

    def __post_init__(self) -> None:
        if not self.shape:
            raise MeshError("a mesh needs at least one axis; pass shape=(world_size,) for a flat mesh")
        for s in self.shape:
            if not isinstance(s, int) or s < 1:
                raise MeshError(f"mesh axis sizes must be positive integers, got shape={self.shape}")
        if math.prod(self.shape) > MAX_WORLD_SIZE:
            raise MeshError(f"mesh shape {self.shape} has {math.prod(self.shape)} ranks; at most {MAX_WORLD_SIZE} "
                            "(2**24) are supported")
        if not self.axis_names:
            if len(self.shape) > len(AXIS_NAMES):
                raise MeshError(f"at most {len(AXIS_NAMES)} mesh axes are supported, got {len(self.shape)}")
            object.__setattr__(self, "axis_names", AXIS_NAMES[: len(self.shape)])
        if len(self.axis_names) != len(self.shape):
            raise MeshError(f"{len(self.axis_names)} axis names for {len(self.shape)} mesh axes")
        if len(set(self.axis_names)) != len(self.axis_names):
            raise MeshError(f"mesh axis names must be distinct, got {self.axis_names}")
        if self.ranks_per_node < 1:
            raise MeshError(f"ranks_per_node must be >= 1, got {self.ranks_per_node}")

    # --- sizes ---------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return math.prod(self.shape)

    def axis_index(self, axis: str) -> int:
        try:
            return self.axis_names.index(axis)
        except ValueError:
            raise MeshError(f"unknown mesh axis {axis!r}; this mesh has axes {self.axis_names}") from None

    def axis_size(self, axis: str) -> int:
        return self.shape[self.axis_index(axis)]

    def size(self, axes: tuple[str, ...] | list[str]) -> int:
        """Number of ranks in one group over `axes` (1 for no axes)."""
        sizes = self.__dict__.get("_sizes")
        if sizes is None:
            sizes = {(a,): n for a, n in zip(self.axis_names, self.shape)} | {(): 1}
            object.__setattr__(self, "_sizes", sizes)
        key = axes if isinstance(axes, tuple) else tuple(axes)
        n = sizes.get(key)
        if n is None:
            try:
                n = math.prod(sizes[(a,)] for a in key)
            except KeyError:
                return math.prod(self.axis_size(a) for a in key)  # raises MeshError naming the axis
            sizes[key] = n
        return n

    def stride(self, axis: str) -> int:
        return math.prod(self.shape[self.axis_index(axis) + 1 :])

    # --- topology ------------------------------------------------------------------------------
    def is_intra_node(self, axes: tuple[str, ...] | list[str]) -> bool:
        """True when every group over `axes` stays inside one node.

        The group of an axis spans stride * size consecutive ranks; nodes are aligned blocks of
        ranks_per_node ranks, so the group is inside a node when that span divides ranks_per_node.
        """
        for a in axes:
            span = self.stride(a) * self.axis_size(a)
            if span > self.ranks_per_node or self.ranks_per_node % span:
                return False
        return True

    # --- coordinates ---------------------------------------------------------------------------
    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of `rank`, by axis name."""
        out: dict[str, int] = {}
        for name, size in zip(reversed(self.axis_names), reversed(self.shape)):
            out[name] = rank % size
            rank //= size
        return dict(reversed(list(out.items())))

    def rank_of(self, coords: dict[str, int]) -> int:
        rank = 0
        for name, size in zip(self.axis_names, self.shape):
            rank = rank * size + coords[name]
        return rank

    def groups(self, axes: tuple[str, ...]) -> list[list[int]]:
        """All groups over `axes`: each a list of ranks ordered by the coordinates of `axes` in the
        given order (first axis outermost). Every rank is in exactly one group."""
        others = [a for a in self.axis_names if a not in axes]
        out = []
        for fixed in product(*(range(self.axis_size(a)) for a in others)):
            base = dict(zip(others, fixed))
            members = []
            for var in product(*(range(self.axis_size(a)) for a in axes)):
                members.append(self.rank_of({**base, **dict(zip(axes, var))}))
            out.append(members)
        return out

    def __str__(self) -> str:
        return "x".join(str(s) for s in self.shape) + "(" + ",".join(self.axis_names) + ")"

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "axis_names": list(self.axis_names),
                "ranks_per_node": self.ranks_per_node}

    @classmethod
    def from_json(cls, data: dict) -> Mesh:
        return cls(tuple(data["shape"]), tuple(data["axis_names"]), int(data["ranks_per_node"]))


def check_world_size(world_size: object) -> int:
    """`world_size` if it is an int in [1, MAX_WORLD_SIZE]; else MeshError saying the bound and why."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise MeshError(f"world size must be a positive integer, got {world_size!r}")
    if world_size > MAX_WORLD_SIZE:
        raise MeshError(f"world size {world_size} is more ranks than the planner supports (at most {MAX_WORLD_SIZE} "
                        "= 2**24, over 100 times the largest GPU clusters); give the number of GPUs")
    return world_size


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of n >= 1 by trial division (n is at most MAX_WORLD_SIZE: at most 2**12 steps)."""
    out: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


def candidate_meshes(world_size: int, ranks_per_node: int = 8) -> list[Mesh]:
    """The mesh shapes the planner tries for `world_size` ranks.

    Always the flat mesh (N,); a square (q, q) when N = q^2 * d; a cube (q, q, q) when N = q^3 * d, with the
    data-parallel remainder d as an extra outermost axis when d > 1. Ordered from fewest to most axes. The
    largest q with q^k dividing N comes from N's prime factors: q = prod p^(e_p // k).
    """
    world_size = check_world_size(world_size)
    factors = prime_factors(world_size)
    meshes = [Mesh((world_size,), ranks_per_node=ranks_per_node)]
    for dims in (2, 3):
        best = math.prod(p ** (e // dims) for p, e in factors.items())
        if best < 2:
            continue
        rest = world_size // best**dims
        shape = ((rest,) if rest > 1 else ()) + (best,) * dims
        if len(shape) <= len(AXIS_NAMES) and all(m.shape != shape for m in meshes):
            meshes.append(Mesh(shape, ranks_per_node=ranks_per_node))
    return meshes
