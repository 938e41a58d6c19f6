"""Which collective this rank is waiting in, for the watchdog that gives every collective a deadline.

Every collective the project issues (`layers3d.comm`, the process groups of `DeviceMesh`, the gathers of
`planner verify`) runs inside `tracked(kind, ranks, what)`: while it runs, `in_flight()` says which one it
is (its kind, the global ranks of its group, the per-group sequence number, how long it has waited) and
`finished()` counts the collectives done per group. The guard thread of `planner.verify.guard` publishes
this beside its heartbeat, so when one rank waits past the deadline it can name the collective and the
peers that are not in it (where they are instead). Ranks that run the same program number the
collectives of a group the same way, so equal (group, sequence number) means the same collective.

Plain module state read from another thread: each update is a single reference assignment (atomic
under the GIL); the reader copies what it sees.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["InFlight", "tracked", "in_flight", "finished", "reset"]


@dataclass(frozen=True)
class InFlight:
    """One collective that has started and not finished on this rank."""

    kind: str
    ranks: tuple[int, ...]
    seq: int
    what: str
    since: float  # time.monotonic() when it started

    def describe(self) -> str:
        group = "all ranks" if not self.ranks else "ranks " + ",".join(map(str, self.ranks))
        return f"{self.kind} #{self.seq} over {group}" + (f" ({self.what})" if self.what else "")

    def key(self) -> str:
        return f"{self.kind}|{','.join(map(str, self.ranks))}|{self.seq}"


_current: InFlight | None = None
_done: dict[tuple[int, ...], int] = {}


@contextmanager
def tracked(kind: str, ranks: Sequence[int], what: str = "") -> Iterator[None]:
    """Mark a collective over the global `ranks` (empty: every rank) as in flight while the block runs."""
    global _current
    group = tuple(sorted(ranks))
    seq = _done.get(group, 0)
    outer = _current
    _current = InFlight(kind, group, seq, what, time.monotonic())
    try:
        yield
    finally:
        _done[group] = seq + 1
        _current = outer


def in_flight() -> InFlight | None:
    """The collective this rank is waiting in, or None."""
    return _current


def finished(ranks: Sequence[int]) -> int:
    """How many collectives over the group of global `ranks` this rank has finished."""
    return _done.get(tuple(sorted(ranks)), 0)


def reset() -> None:
    """Forget every count (a new process group: its collectives are numbered from zero again)."""
    global _current
    _current = None
    _done.clear()
