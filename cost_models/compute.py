"""Compute time: a roofline over FLOPs and device-memory traffic, plus the FLOP formulas we use.

    seconds = max(flops / (peak[dtype] * efficiency), bytes / mem_bandwidth)

Matmul FLOPs follow `torch.utils.flop_counter` (2 m k n for [m, k] @ [k, n], backward twice the forward
when both operands need gradients). Element-wise, normalisation, softmax and shape ops are memory-bound:
their FLOPs are small per element (each family registers its count, `cost_models.family`) and their time is the bytes read
and written over the memory bandwidth.
"""

from __future__ import annotations

from cost_models.hardware import HardwareProfile

__all__ = ["roofline_seconds", "matmul_flops"]

def matmul_flops(m: int, k: int, n: int, batch: int = 1) -> int:
    """FLOPs of a (batched) [m, k] @ [k, n]: 2 m k n per batch entry (torch.utils.flop_counter's mm)."""
    return 2 * batch * m * k * n


def roofline_seconds(flops: float, nbytes: float, dtype: str, hw: HardwareProfile) -> float:
    """Seconds for `flops` of math in `dtype` that reads and writes `nbytes` of device memory."""
    if flops <= 0 and nbytes <= 0:
        return 0.0
    return max(flops / hw.peak(dtype), nbytes / hw.mem_bandwidth)
