"""Activation checkpointing whose recomputed collectives are recorded as phase "recompute".

A thin wrapper over non-reentrant torch.utils.checkpoint: the recompute context is
`layers3d.comm.recompute_phase()`, and early stopping is off so that *every* forward collective of the
block runs again in backward, as the cost model assumes (a checkpointed block pays its whole forward
communication twice).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch.utils.checkpoint as tuc

from layers3d.comm import recompute_phase

__all__ = ["checkpoint", "checkpoint_contexts"]


def checkpoint_contexts() -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
    """The (forward, recompute) contexts to pass as torch.utils.checkpoint's `context_fn`."""
    return nullcontext(), recompute_phase()


def checkpoint(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run `fn(*args, **kwargs)` keeping only its inputs; recompute it (recording "recompute") in backward."""
    return tuc.checkpoint(fn, *args, use_reentrant=False, context_fn=checkpoint_contexts, early_stop=False,
                          **kwargs)
