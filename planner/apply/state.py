"""`gather_state_dict`: the dense state dict of a parallel model, put back together from the shards.

Every parameter's block is all-gathered over the mesh axes that split it (`layers3d.gather_tensor`, one
collective per split dim), so the result is complete on every rank; call it on every rank. Keys and shapes
are those of the dense model's `state_dict()`, tied parameters under each of their keys. `gather_grads`
does the same for the gradients (for comparing with a dense run).
"""

from __future__ import annotations

import torch

from layers3d.shard import gather_tensor
from planner.apply.layers import ParamHome
from planner.apply.rewrite import ParallelModule
from planner.apply.values import ApplyError

__all__ = ["gather_state_dict", "gather_grads"]


def _check(model: object) -> ParallelModule:
    if not isinstance(model, ParallelModule):
        raise ApplyError(f"gather_state_dict needs the module apply_plan returned, got {type(model).__name__}")
    return model


def _gather(pm: ParallelModule, home: ParamHome, local: torch.Tensor) -> torch.Tensor:
    full = gather_tensor(local, home.dims, pm.device_mesh, interleave=home.interleave,
                         interleave_dim=home.interleave_dim, tag="state")
    if tuple(full.shape) != home.shape:
        raise AssertionError(f"gathered {tuple(full.shape)} for a parameter of shape {home.shape}")
    return full


def gather_state_dict(parallel_model: ParallelModule) -> dict[str, torch.Tensor]:
    """The dense state dict (same keys as the dense model's `state_dict()`), on every rank (collective)."""
    pm = _check(parallel_model)
    full: dict[str, torch.Tensor] = {}
    for name, home in pm.homes.items():  # same order on every rank: the graph's
        full[name] = _gather(pm, home, home.local.detach())
    for name, attr in pm.buffer_attrs.items():
        full[name] = pm.get_buffer(attr).detach().clone()
    for name, t in pm.extra.items():
        full[name] = t.detach().clone()
    return {key: full[name] for key, name in pm.dense_keys.items()}


def gather_grads(parallel_model: ParallelModule) -> dict[str, torch.Tensor]:
    """The dense gradient of every parameter, by canonical parameter name, on every rank (collective).
    A rank whose block has no gradient contributes zeros."""
    pm = _check(parallel_model)
    out: dict[str, torch.Tensor] = {}
    for name, home in pm.homes.items():
        g = home.local.grad
        out[name] = _gather(pm, home, (g if g is not None else torch.zeros_like(home.local)).detach())
    return out
