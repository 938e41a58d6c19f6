"""One SGD step of a zoo model, dense and parallel, compared per tensor (the check that catches a wrong bias).

`sgd_reference(name)` runs in the parent: the dense loss, gradients and the parameters after one SGD step.
`sgd_compare(name, plan, ref)` runs on every rank: it applies the plan, takes the same step and returns the
per-tensor comparisons of `planner.verify.compare` (gradients with the global-norm floor; parameters on
their own scale with the same floor taken on the SGD moves), plus loss, activations and peak memory.
"""

from __future__ import annotations

from typing import Any

import torch
from apply_checks import call, device_mesh, loss_of
from zoo import build

from planner.apply.rewrite import apply_plan
from planner.apply.state import gather_grads, gather_state_dict
from planner.plans.format import Plan
from planner.verify.compare import compare, grad_floor, moved
from planner.verify.measure import SavedActivationMeter
from planner.verify.measure_memory import step_peak_bytes

__all__ = ["LR", "LossOf", "make", "sgd_reference", "sgd_compare"]

LR = 0.1


class LossOf(torch.nn.Module):
    """A HF model that computes its own loss, wrapped as users wrap it: `forward(**inputs)` returns the
    loss of the inner model (held at `m`), so the loss op's module path is that whole HF model."""

    def __init__(self, m: torch.nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=input_ids, labels=labels).loss


def make(name: str, wrapped: bool = False, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """Zoo model `name` and its inputs, wrapped in `LossOf` when asked."""
    ex = build(name, **overrides)
    return (LossOf(ex.model) if wrapped else ex.model), ex.example_inputs


def _sgd(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= LR * p.grad


def _floats(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items() if v.is_floating_point()}


def sgd_reference(name: str, wrapped: bool = False, **overrides: Any) -> dict[str, Any]:
    model, inputs = make(name, wrapped, **overrides)
    before = _floats(model.state_dict())
    loss = loss_of(call(model, inputs))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    _sgd(model)
    return {"loss": loss.item(), "grads": grads, "before": before, "after": _floats(model.state_dict())}


def sgd_compare(name: str, plan: Plan, ref: dict[str, Any], *, wrapped: bool = False, peak: bool = False,
                **overrides: Any) -> dict[str, Any]:
    model, inputs = make(name, wrapped, **overrides)
    parallel = apply_plan(model, plan, mesh=device_mesh(plan.mesh))
    with SavedActivationMeter.for_module(parallel) as meter:
        loss = loss_of(call(parallel, inputs))
    loss.backward()
    grads = compare(gather_grads(parallel), ref["grads"], grad_floor(ref["grads"]))
    _sgd(parallel)
    params = compare(gather_state_dict(parallel), ref["after"], grad_floor(moved(ref["after"], ref["before"])))
    out = {"loss": (ref["loss"], loss.item()), "grads": grads, "params": params,
           "activation_bytes": meter.bytes, "predicted_activation_bytes": plan.predicted.activation_bytes}
    if peak:
        parallel.zero_grad(set_to_none=True)
        out["peak"] = step_peak_bytes(parallel, lambda: loss_of(call(parallel, inputs)),
                                      torch.optim.AdamW(parallel.parameters(), lr=1e-4))["peak"]
        out["predicted_peak"] = plan.predicted.peak_memory_bytes
    return out
