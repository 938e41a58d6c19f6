"""What the distributed apply tests run on every rank: a plan applied next to the dense model.

`compare_with_dense` applies a plan, runs one forward/backward of the dense and the parallel model on the
same inputs (counting the parallel collectives), then `steps` AdamW steps of both, and returns plain
numbers: relative errors of loss and gradients, the losses after each step, the state-dict error after the
steps, and measured and predicted collective bytes per (kind, phase). Ranks send these back as bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from layers3d.comm import CommCounter
from planner.apply import apply_plan
from planner.measure import SavedActivationMeter
from planner.plan_format import Plan
from planner.state import gather_grads, gather_state_dict
from planner.verify_predict import by_kind, predicted_collectives
from planner.verify_report import rel_error

__all__ = ["compare_with_dense", "call", "loss_of"]


def call(model: nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def loss_of(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "loss"):
        return out["loss"]
    return out[0]


def compare_with_dense(build: Callable[[], tuple[nn.Module, Any]], plan: Plan, *, steps: int = 5, lr: float = 1e-3,
                       eps: float = 1e-6, inputs_mode: str = "full") -> dict[str, Any]:
    """See the module docstring. `build()` returns (dense model, inputs) the same on every rank."""
    dense, inputs = build()
    parallel = apply_plan(dense, plan, inputs=inputs_mode)
    loss_d = loss_of(call(dense, inputs))
    loss_d.backward()
    with CommCounter() as counter:
        with SavedActivationMeter.for_module(parallel) as meter:
            loss_p = loss_of(call(parallel, inputs))
        loss_p.backward()
    params = dict(dense.named_parameters())
    grads = gather_grads(parallel)
    grad_err = {n: rel_error(g, params[n].grad) for n, g in grads.items()}
    out: dict[str, Any] = {
        "loss": (loss_d.item(), loss_p.item()),
        "grad_error": max(grad_err.values()),
        "worst_grad": max(grad_err, key=grad_err.get),
        "grads_compared": len(grad_err),
        "measured_comm": dict(by_kind([c for c in counter.records if c.tag not in ("io", "tied")])),
        "predicted_comm": dict(by_kind(predicted_collectives(parallel.source_graph, plan).collectives)),
        "unplanned_comm": {tag: sum(c.bytes for c in counter.records if c.tag == tag) for tag in ("io", "tied")},
        "activation_bytes": meter.bytes,
        "predicted_activation_bytes": plan.predicted.activation_bytes,
    }
    opt_d = torch.optim.AdamW(dense.parameters(), lr=lr, eps=eps)
    opt_p = torch.optim.AdamW(parallel.parameters(), lr=lr, eps=eps)
    losses = []
    for k in range(steps):
        if k:
            for m in (dense, parallel):
                m.zero_grad(set_to_none=True)
            loss_of(call(dense, inputs)).backward()
            loss_of(call(parallel, inputs)).backward()
        opt_d.step()
        opt_p.step()
        with torch.no_grad():
            losses.append((loss_of(call(dense, inputs)).item(), loss_of(call(parallel, inputs)).item()))
    out["step_losses"] = losses
    state, ref = gather_state_dict(parallel), dense.state_dict()
    out["state_keys_equal"] = list(state) == list(ref)
    floats = [k for k in ref if ref[k].is_floating_point()]
    floor = max(ref[k].abs().max().item() for k in floats)
    errs = {k: rel_error(state[k], ref[k], floor) for k in floats}
    out["state_error"] = max(errs.values())
    out["worst_state"] = max(errs, key=errs.get)
    out["nonfloat_equal"] = all(torch.equal(state[k], ref[k]) for k in ref if k not in floats)
    return out
