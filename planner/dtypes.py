"""Dtype names as plans, profiles and input specs write them, and the torch dtypes they stand for.

The table is closed (built once from the keys of `cost_models.ops.DTYPE_BYTES`), so a name read from a
file is never looked up on the torch module. Shared by every stage (capture, apply, the example models).
"""

from __future__ import annotations

import torch

from cost_models.ops import DTYPE_BYTES

__all__ = ["TORCH_DTYPES", "dtype_name", "torch_dtype"]


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> "float32"."""
    return str(dtype).removeprefix("torch.")


# The dtypes a plan or an input spec may name: a closed table built once from the project's own list
# (the keys of cost_models.ops.DTYPE_BYTES), so a name read from a file is never looked up on the torch module.
TORCH_DTYPES: dict[str, torch.dtype] = {
    name: d for name in DTYPE_BYTES if isinstance(d := getattr(torch, name, None), torch.dtype)}


def torch_dtype(name: object) -> torch.dtype | None:
    """The torch dtype for a name of TORCH_DTYPES (or a torch.dtype itself); None for anything else."""
    if isinstance(name, torch.dtype):
        return name
    return TORCH_DTYPES.get(name) if isinstance(name, str) else None
