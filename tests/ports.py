"""Ports for the distributed tests' rendezvous that nothing else hands out while the ranks start.

A port found by binding port 0 and closing the socket stays free only until someone else takes it, and the
rank that hosts the store binds it a second or more later (after importing torch): meanwhile another xdist
worker may be handed the same port, or the kernel may give it to an outgoing connection as its source port,
since both come from the ephemeral range (Linux: 32768-60999). A test whose store port was taken that way
hung once in CI. These ports come from below that range, a separate slice per xdist worker, each checked
free and handed out at most once per round through the slice.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator

__all__ = ["free_port"]

_LOW = 20_000  # slices of _SLICE ports from here up, one per xdist worker (12 of them below 32,000)
_SLICE = 1_000
_order: Iterator[int] | None = None


def _slice() -> list[int]:
    """This process's ports: its xdist worker's slice (gw0 for a run without workers), in a shuffled order."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    start = _LOW + (n % 12) * _SLICE
    ports = list(range(start, start + _SLICE))
    random.Random(os.getpid()).shuffle(ports)  # another run of the same worker starts elsewhere in it
    return ports


def free_port() -> int:
    """A port on 127.0.0.1 that binds now and that no other test of this run is handed (see the module
    docstring); the kernel's choice only where the whole slice is taken."""
    global _order
    if _order is None:
        _order = itertools.cycle(_slice())
    for _ in range(_SLICE):
        port = next(_order)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
