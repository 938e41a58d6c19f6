"""Dropout under `planner verify`: numerics with dropout off in both models, masks checked apart.

A dense and a parallel run draw different masks (the parallel one follows the model-parallel rule of
`layers3d.ParallelDropout`), so their numbers compare only with dropout off: `dropout_off` switches it
off in both (every `ParallelDropout` of the parallel model, and `torch.nn.functional.dropout`, which
`nn.Dropout` and HF's eager attention call, for the dense one). The masks are checked on their own by
`mask_report`: in one forward with dropout on, ranks whose coordinates on the axes that split a dropout's
input are equal (they hold the same elements) must draw equal masks, ranks whose coordinates differ
must draw different masks, and the kept fraction must be 1 - p within 6 standard deviations.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from layers3d.dropout import ParallelDropout

__all__ = ["live_dropouts", "dropout_off", "mask_report"]


def live_dropouts(parallel: nn.Module) -> list[ParallelDropout]:
    return [m for m in parallel.modules() if isinstance(m, ParallelDropout) and m.p > 0]


@contextlib.contextmanager
def dropout_off(parallel: nn.Module) -> Iterator[None]:
    """Dropout is the identity in both models inside the block."""
    mods = live_dropouts(parallel)
    saved_p = [m.p for m in mods]
    saved_fn = F.dropout

    def identity(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        return x

    F.dropout = identity
    for m in mods:
        m.p = 0.0
    try:
        yield
    finally:
        F.dropout = saved_fn
        for m, p in zip(mods, saved_p):
            m.p = p


def mask_report(parallel: nn.Module, run: Any) -> list[str]:
    """Run `run()` (a forward with dropout on) recording every mask, and check the rule on every rank's
    masks (a collective); returns the violations (empty when the rule holds)."""
    mods = live_dropouts(parallel)
    for m in mods:
        m.record = True
    try:
        with torch.no_grad():
            run()
    finally:
        for m in mods:
            m.record = False
    mine = []
    for m in mods:
        mask = m.last_mask
        coords = tuple(m.mesh.group_rank((ax,)) for ax in m.split_axes)
        digest = hashlib.sha1(mask.cpu().numpy().tobytes()).hexdigest() if mask is not None else ""
        kept = float(mask.float().mean()) if mask is not None else float("nan")
        mine.append((m.key, m.p, coords, digest, kept, mask.numel() if mask is not None else 0))
        m.last_mask = None
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    problems = []
    for k in range(len(mine)):
        key, p = mine[k][0], mine[k][1]
        by_coords: dict[tuple, set[str]] = {}
        for rank_rows in every:
            _, _, coords, digest, kept, n = rank_rows[k]
            by_coords.setdefault(coords, set()).add(digest)
            sigma = (p * (1 - p) / max(n, 1)) ** 0.5
            if abs(kept - (1 - p)) > 6 * sigma:
                problems.append(f"{key}: kept {kept:.3f} of the elements, expected {1 - p:.3f}")
        if any(len(d) > 1 for d in by_coords.values()):
            problems.append(f"{key}: ranks holding the same elements drew different masks")
        firsts = [next(iter(d)) for d in by_coords.values()]
        if len(set(firsts)) < len(firsts):
            problems.append(f"{key}: ranks holding different elements drew the same mask")
    return sorted(set(problems))
