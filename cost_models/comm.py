"""Alpha-beta cost of collectives (ring algorithms).

With n ranks in the group and B the per-rank size of the collective's full buffer (the bytes convention
of docs/ARCHITECTURE.md: the gathered output of an all-gather, the unreduced input of a reduce-scatter or
all-reduce, the local tensor of an all-to-all or broadcast):

    all_gather, reduce_scatter, all_to_all   alpha (n - 1)        + beta B (n - 1) / n
    all_reduce                               2 alpha (n - 1)      + 2 beta B (n - 1) / n
    broadcast, "pipelined" (NCCL)            alpha ceil(log2 n)   + beta B
    broadcast, "binomial" (gloo)             alpha ceil(log2 n)   + beta B ceil(log2 n)

The two broadcasts differ in how the buffer travels: a pipelined broadcast streams it in chunks, so each
rank receives it about once after ceil(log2 n) hops of latency; gloo (gloo/broadcast.cc) sends the whole
buffer along a binomial tree, rank 0 -> 1, then {0, 1} -> {2, 3}, ..., and a rank forwards only after its
receive completed, so the last rank waits for ceil(log2 n) full transfers. The profile says which
(`HardwareProfile.broadcast_algorithm`).

alpha and beta are those of the intra-node link when every group over the collective's axes stays inside
one node (`Mesh.is_intra_node`), else of the inter-node link; a profile may override them per collective
and per (collective, group size).
A group of one rank costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from cost_models.errors import PlannerError
from cost_models.hardware import HardwareProfile
from cost_models.mesh import Mesh
from cost_models.strategy import Collective

__all__ = ["ring_seconds", "collective_seconds", "total_seconds", "link_of", "CommError"]


class CommError(PlannerError, ValueError):
    """A collective that the alpha-beta model cannot price (unknown kind or negative size)."""


def ring_seconds(kind: str, n: int, nbytes: float, alpha: float, beta: float,
                 broadcast: str = "pipelined") -> float:
    """Seconds of one collective of `kind` over `n` ranks moving a full buffer of `nbytes` per rank;
    `broadcast` is the broadcast algorithm ("pipelined" or "binomial", see the module docstring)."""
    if n < 1:
        raise CommError(f"a collective group needs at least one rank, got n={n}")
    if nbytes < 0:
        raise CommError(f"collective size must be >= 0 bytes, got {nbytes}")
    if n == 1:
        return 0.0
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return alpha * (n - 1) + beta * nbytes * (n - 1) / n
    if kind == "all_reduce":
        return 2 * alpha * (n - 1) + 2 * beta * nbytes * (n - 1) / n
    if kind == "broadcast":
        hops = math.ceil(math.log2(n))
        if broadcast == "binomial":
            return hops * (alpha + beta * nbytes)
        if broadcast == "pipelined":
            return alpha * hops + beta * nbytes
        raise CommError(f"unknown broadcast algorithm {broadcast!r}; expected 'pipelined' or 'binomial'")
    raise CommError(f"unknown collective kind {kind!r}; expected all_gather, reduce_scatter, all_reduce, "
                    "all_to_all or broadcast")


def link_of(axes: Iterable[str], mesh: Mesh) -> str:
    """"intra" when every group over `axes` stays inside one node, else "inter"."""
    return "intra" if mesh.is_intra_node(tuple(axes)) else "inter"


def collective_seconds(c: Collective, mesh: Mesh, hw: HardwareProfile) -> float:
    """Alpha-beta seconds of collective `c` on `mesh` with the link numbers of `hw`."""
    n = mesh.size(c.axes)
    if n == 1:
        return 0.0
    alpha, beta = hw.alpha_beta(link_of(c.axes, mesh), c.kind, n)
    return ring_seconds(c.kind, n, c.bytes, alpha, beta, hw.broadcast_algorithm)


def total_seconds(collectives: Iterable[Collective], mesh: Mesh, hw: HardwareProfile,
                  phase: str | None = None) -> float:
    """Sum of `collective_seconds` over `collectives` (only those of `phase` when given)."""
    return sum(collective_seconds(c, mesh, hw) for c in collectives if phase is None or c.phase == phase)
