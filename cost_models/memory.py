"""Memory per rank: model states, saved activations, transient buffers.

    model states   = local parameter elements x bytes per parameter (BYTES_PER_PARAM presets)
                     + buffer bytes (running statistics: not trained, counted at their own size)
    saved          = the tensors autograd keeps for backward, each counted once by its key
    transient      = the largest set of temporary buffers alive together while one op or one layout
                     conversion runs, forward or backward (gathered buffers, collective staging, the
                     gradients flowing in and out of it): its working set beyond what is saved; the
                     plan's accounting adds the activation gradients autograd holds beside it (waiting
                     residual gradients, accumulation buffers: `cost_models.grad_buffers`)
    optimizer step = model states + what the optimizer step holds beside them (`cost_models.optimizer`)
    peak           = the most, over the points of one training step, of what is alive there (`step_peak`)
                  <= model states + max(saved + max transient, the optimizer step's beyond the states)
                     (the bound the budget is checked against; the solver's memory row counts both terms
                     together: `cost_models.optimizer.solver_optimizer_bytes`)

The peak this predicts is what `planner.verify.measure_memory` measures: the most bytes held at once by tensor
storages during a training step (parameters, gradients, optimizer states, inputs, everything the step
creates). The backward pass runs the ops in reverse: when it differentiates op i, the gradients of the
parameters of ops i..n-1 exist, those of ops 0..i-1 do not yet, and the saved activations of ops after i
are freed already (a tensor saved by several ops is charged to the first of them, so it lives until that
op's backward). `step_peak` takes the largest of these points and of the optimizer step (all states, the
temporaries the optimizer's implementation holds beside them and the caller's inputs: `cost_models.optimizer`;
nothing saved is alive by then). The bound is states + max(saved + max transient, the step's beyond states).
For a small model whose gradients are as large as its activations (HF GPT-2 tiny: 1.75 MB of gradients
against 4.6 MB saved on a replicated rank), counting everything alive together over-predicted by 11%.

What each op saves is in docs/ARCHITECTURE.md ("Saved activations"); this module holds the device-kind
facts (dropout masks) and the sums, so tests and the plan builder count the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cost_models.errors import PlannerError
from cost_models.mesh import Mesh
from cost_models.ops import DTYPE_BYTES
from cost_models.redistribution import Step
from cost_models.strategy import OpCost, SavedTensor

__all__ = ["BYTES_PER_PARAM", "MemoryModelError", "DEVICE_KINDS", "dropout_mask_itemsize", "dropout_grad_before_mask", "norm_stats_itemsize", "model_state_bytes",
           "unique_saved_bytes", "peak_bytes", "resolve_bytes_per_param",
           "conversion_working_set", "conversion_pair_working_set", "grad_bytes_per_param", "StepPeak",
           "step_peak"]

# Bytes of model state per parameter element:
#   fp32_adam:  4 param + 4 grad + 4 Adam m + 4 Adam v
#   bf16_mixed: 2 bf16 param + 4 fp32 grad + 4 fp32 master + 4 m + 4 v (Megatron-LM's accounting)
#   inference:  2 (bf16 / fp16 weights only)
BYTES_PER_PARAM = {"fp32_adam": 16, "bf16_mixed": 18, "inference": 2}
DEVICE_KINDS = ("cuda", "cpu")


class MemoryModelError(PlannerError, ValueError):
    """A memory-model input that makes no sense (unknown device kind or bytes-per-parameter preset)."""


def resolve_bytes_per_param(value: int | str) -> int:
    """An integer as is, or a BYTES_PER_PARAM preset name."""
    if isinstance(value, str):
        if value not in BYTES_PER_PARAM:
            raise MemoryModelError(f"unknown bytes-per-parameter preset {value!r}; known: {sorted(BYTES_PER_PARAM)} "
                               "or pass an integer")
        return BYTES_PER_PARAM[value]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MemoryModelError(f"bytes_per_param must be a positive integer or a preset name, got {value!r}")
    return value


def dropout_mask_itemsize(dtype: str, device: str) -> int:
    """Bytes per element of the mask dropout saves: CUDA's fused kernel keeps a 1-byte bool mask; the CPU
    path multiplies by a noise tensor of the input's dtype and saves that (measured with torch 2.13)."""
    if device == "cuda":
        return 1
    if device == "cpu":
        return DTYPE_BYTES[dtype]
    raise MemoryModelError(f"device kind must be one of {DEVICE_KINDS}, got {device!r}")


def dropout_grad_before_mask(device: str) -> bool:
    """Whether dropout's backward makes a gradient-sized tensor before it unpacks the mask: the CPU path
    is two autograd nodes, the product with the noise and then the scaling, so the scaling's backward
    runs first (what a checkpointed block holds when that unpack starts its recomputation; measured
    with torch 2.13). CUDA's fused kernel is one node."""
    if device not in DEVICE_KINDS:
        raise MemoryModelError(f"device kind must be one of {DEVICE_KINDS}, got {device!r}")
    return device == "cpu"


def norm_stats_itemsize(dtype: str, device: str) -> int:
    """Bytes per element of the mean and rstd layer norm saves: CUDA keeps them in fp32 (the accumulate
    type) for 16-bit inputs; the CPU kernel keeps them in the input's dtype (measured with torch 2.13)."""
    if device == "cuda":
        return max(4, DTYPE_BYTES[dtype])
    if device == "cpu":
        return DTYPE_BYTES[dtype]
    raise MemoryModelError(f"device kind must be one of {DEVICE_KINDS}, got {device!r}")


def model_state_bytes(param_elems: int, bytes_per_param: int | str) -> int:
    return param_elems * resolve_bytes_per_param(bytes_per_param)


def unique_saved_bytes(saved: Iterable[SavedTensor]) -> int:
    """Bytes of saved tensors, each key counted once (two ops saving the same tensor share it)."""
    seen: dict[str, int] = {}
    for s in saved:
        if s.key in seen and seen[s.key] != s.bytes:
            raise AssertionError(f"saved tensor {s.key} has two sizes: {seen[s.key]} and {s.bytes}")
        seen[s.key] = s.bytes
    return sum(seen.values())


def peak_bytes(costs: Iterable[OpCost], bytes_per_param: int | str) -> int:
    """Model states + unique saved activations + the largest transient of a list of op costs (no
    checkpointing): the per-rank peak the solver's memory model gives for one choice per op."""
    costs = list(costs)
    bpp = resolve_bytes_per_param(bytes_per_param)
    states = sum(c.param_elems for c in costs) * bpp + sum(c.buffer_bytes for c in costs)
    saved = unique_saved_bytes(s for c in costs for s in c.saved)
    transient = max((c.transient_bytes for c in costs), default=0)
    return states + saved + transient


def conversion_working_set(steps: Sequence[Step], shape: Sequence[int], itemsize: int, mesh: Mesh) -> int:
    """Most bytes alive at once while the runtime (`layers3d.redistribute`) runs `steps` on one local
    tensor: the tensor it started from (held by its caller throughout), the current step's input, the
    step's staging buffers and its output. Staging follows `layers3d.comm`: an all-gather receives the n
    blocks into separate buffers and concatenates them (staging = the gathered size); an all-to-all copies
    its send blocks unless they split dim 0, receives n blocks, and concatenates them; a reduce-scatter
    copies its send blocks unless they split dim 0; an all-reduce and a slice write a fresh output only."""
    if not steps:
        return 0
    first = steps[0].before.local_numel(tuple(shape), mesh) * itemsize
    most = 0
    for i, s in enumerate(steps):
        before = s.before.local_numel(tuple(shape), mesh) * itemsize
        after = s.after.local_numel(tuple(shape), mesh) * itemsize
        if s.kind == "all_gather":
            staging = after
        elif s.kind == "all_to_all":
            staging = before + (before if s.dst_dim != 0 else 0)
        elif s.kind == "reduce_scatter":
            staging = before if s.dim != 0 else 0
        else:
            staging = 0
        most = max(most, first + (before if i else 0) + staging + after)
    return most


def conversion_pair_working_set(forward: Sequence[Step], backward: Sequence[Step], shape: Sequence[int],
                                 itemsize: int, mesh: Mesh) -> int:
    """The working set of a layout conversion and of its gradient's conversion back: the larger of the two
    (they never run at once). What the planner prices per edge and the plan's accounting adds to an op."""
    return max(conversion_working_set(steps, shape, itemsize, mesh) for steps in (forward, backward))


def grad_bytes_per_param(bytes_per_param: int | str) -> int:
    """Bytes of gradient per parameter element within `bytes_per_param`: an fp32 gradient (4) whenever the
    states hold more than a 4-byte weight (fp32_adam, bf16_mixed, any optimizer), none for weights alone
    (inference: 2, or 4 for fp32 weights)."""
    return 4 if resolve_bytes_per_param(bytes_per_param) > 4 else 0


@dataclass(frozen=True)
class StepPeak:
    """The peak of one training step (`step_peak`): `peak` bytes, reached at op `at` (its index in forward
    order; None for the optimizer step), where the op's transient (at the step: what it holds beyond the
    states) is `transient`; `released` is what the bound (states + max(saved + max transient, the step's))
    counts that is not alive there: gradients not yet computed, activations already freed, and the max
    transient's excess over this op's."""

    peak: int
    at: int | None
    transient: int
    released: int


def step_peak(ops: Sequence[tuple[int, int, int]], bytes_per_param: int | str, *, optimizer_bytes: int = 0) -> StepPeak:
    """The most bytes alive at once in a training step, from per-op (state_bytes, saved_bytes,
    transient_bytes) in forward order (see the module docstring): max over the backward of each op i of
    states without the gradients of ops before i + saved of ops up to i + op i's transient, and of the
    optimizer step (every state + `optimizer_bytes`, what the step holds beyond them). Saved bytes must be
    charged to the first op that saves them (as the plan's accounting does), a checkpointed block's kept
    inputs to its first op reading them, and its recomputed activations be part of its ops' transients."""
    bpp = resolve_bytes_per_param(bytes_per_param)
    gbp = grad_bytes_per_param(bpp)
    states = sum(o[0] for o in ops)
    saved_total = sum(o[1] for o in ops)
    bound = states + max(saved_total + max((o[2] for o in ops), default=0), optimizer_bytes)
    grads = [o[0] // bpp * gbp for o in ops]
    best = StepPeak(states + optimizer_bytes, None, optimizer_bytes, bound - states - optimizer_bytes)
    grads_before, saved_upto = 0, 0
    for i, (_, saved, transient) in enumerate(ops):
        saved_upto += saved
        value = states - grads_before + saved_upto + transient
        if value > best.peak:
            best = StepPeak(value, i, transient, bound - value)
        grads_before += grads[i]
    return best
