"""The optimizer step's temporaries: what torch's AdamW holds beside every model state while it updates.

torch runs AdamW in one of three implementations (`torch.optim.AdamW(foreach=..., fused=...)`), and they
differ in what they allocate while the step runs (measured with torch 2.13, `planner.verify.measure_memory`):

    single_tensor  one parameter at a time: sqrt(exp_avg_sq) and its division by the bias correction are
                   alive together, two temporaries of the parameter's size: 2 x the largest local parameter.
                   torch's default on CPU.
    foreach        every parameter at once: `_foreach_sqrt` of every exp_avg_sq, one temporary per
                   parameter, all alive together: 1 x all local parameters. torch's default on CUDA.
    fused          one kernel per parameter group, no temporaries of a parameter's size.

The temporaries have the optimizer states' element size (fp32: the moments, and the master weights of
bf16 mixed precision) and exist only when the step trains (an inference preset has none). Beside them the
caller still holds the step's inputs (a training loop's batch outlives the step). A plan records
the implementation it was priced for (`PlanOptions.optimizer`), and `optimizer_kwargs` gives the
`torch.optim.AdamW` arguments that select it, so `planner verify` and a training script run what was priced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cost_models.errors import PlannerError
from cost_models.layout import caller_layout
from cost_models.memory import DEVICE_KINDS, grad_bytes_per_param
from cost_models.mesh import Mesh

__all__ = ["OPTIMIZER_IMPLS", "OptimizerError", "default_optimizer", "resolve_optimizer", "optimizer_kwargs",
           "op_optimizer_bytes", "step_optimizer_bytes", "optimizer_step_bytes", "solver_optimizer_bytes"]

OPTIMIZER_IMPLS = ("single_tensor", "foreach", "fused")
STATE_ITEMSIZE = 4  # the moments (and bf16_mixed's master weights) are fp32


class OptimizerError(PlannerError, ValueError):
    """An optimizer implementation the planner does not know."""


def _check(optimizer: str) -> None:
    if optimizer not in OPTIMIZER_IMPLS:
        raise OptimizerError(f"unknown optimizer implementation {optimizer!r}; use one of {', '.join(OPTIMIZER_IMPLS)} "
                             "(torch.optim.AdamW's for-loop, foreach or fused step)")


def default_optimizer(device: str) -> str:
    """torch's default AdamW implementation for parameters on `device`: foreach on CUDA, single-tensor on
    CPU (torch.optim.optimizer._default_to_fused_or_foreach; fused is never the default)."""
    if device not in DEVICE_KINDS:
        raise OptimizerError(f"device kind must be one of {DEVICE_KINDS}, got {device!r}")
    return "foreach" if device == "cuda" else "single_tensor"


def resolve_optimizer(value: str | None, device: str) -> str:
    """`value` checked, or torch's default for `device` when None."""
    if value is None:
        return default_optimizer(device)
    _check(value)
    return value


def optimizer_kwargs(optimizer: str | None) -> dict[str, Any]:
    """The `torch.optim.AdamW` keyword arguments that run `optimizer`, the implementation a plan was priced
    for (`plan.options.optimizer`; None, a plan written before it was recorded: torch's default, none)."""
    if optimizer is None:
        return {}
    _check(optimizer)
    return {"single_tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[optimizer]


def op_optimizer_bytes(optimizer: str, param_elems: int, largest_param_elems: int, bytes_per_param: int | str) -> int:
    """What one op's local parameters (`param_elems` elements in all, the largest of `largest_param_elems`)
    make the optimizer step hold: single-tensor 2 x its largest parameter, foreach all of them, fused none
    (see the module docstring); none when the step does not train (weights alone)."""
    _check(optimizer)
    if grad_bytes_per_param(bytes_per_param) == 0 or optimizer == "fused":
        return 0
    if optimizer == "single_tensor":
        return 2 * largest_param_elems * STATE_ITEMSIZE
    return param_elems * STATE_ITEMSIZE


def step_optimizer_bytes(optimizer: str | None, per_op: Iterable[int]) -> int:
    """The temporaries alive together in the optimizer step, from every op's `op_optimizer_bytes`: the
    largest for single-tensor (one parameter at a time), the sum for foreach (all at once). None: a plan
    written before they were counted (its ops' are all 0)."""
    per_op = list(per_op)
    if optimizer == "foreach":
        return sum(per_op)
    return max(per_op, default=0)


def optimizer_step_bytes(optimizer: str | None, per_op: Iterable[int], inputs: Iterable[tuple[Sequence[int], int]],
                         input_mode: str, mesh: Mesh) -> int:
    """What the optimizer step holds beyond the model states: its temporaries (`step_optimizer_bytes` of
    every op's) and the inputs the caller still holds (each (shape, itemsize) in the caller's layout,
    `caller_layout`: the batch outlives the step in a training loop). 0 for None, a plan written before the
    step was counted. The plan's `predicted.optimizer_bytes`; one definition for the plan and its report."""
    if optimizer is None:
        return 0
    held = sum(caller_layout(shape, input_mode, mesh).local_numel(tuple(shape), mesh) * itemsize
               for shape, itemsize in inputs)
    return step_optimizer_bytes(optimizer, per_op) + held


def solver_optimizer_bytes(optimizer: str, op_bytes: int) -> tuple[int, int]:
    """An op's `op_optimizer_bytes` in the solver's memory row (states + saved + the largest transient):
    (bytes added to the op's states, bytes added as a candidate of its transient). Single-tensor's step
    holds the largest op's: a transient candidate. foreach's holds every op's at once, a sum: counted with
    the states. Either way the row counts them beside the activations, where the step does not (the plan's
    bound takes the larger of the two, `Predicted.bound_bytes`): on the safe side, and where that leaves
    memory unused the planner solves again with the difference (`planner.plans.meshes.use_room`)."""
    if optimizer == "foreach":
        return op_bytes, 0
    return 0, op_bytes
