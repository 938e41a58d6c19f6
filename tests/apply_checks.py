"""What the distributed apply tests run: a plan applied next to a dense reference.

`dense_reference` trains the dense model once, in the parent process (every rank would compute the same
numbers): its loss and gradients, then `steps` AdamW steps with the loss after each, then its state dict.
`compare_with_dense` runs on every rank: it applies the plan, repeats the same forward/backward (counting
the parallel collectives and the saved activations) and the same steps, and returns plain numbers:
relative errors against the reference, measured and predicted collective bytes per (kind, phase).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from cost_models.mesh import Mesh
from layers3d.comm import CommCounter
from layers3d.mesh import DeviceMesh
from planner.apply.rewrite import apply_plan
from planner.apply.state import gather_grads, gather_state_dict
from planner.plans.format import Plan
from planner.verify.measure import SavedActivationMeter
from planner.verify.predict import by_kind, predicted_collectives
from planner.verify.report import rel_error

__all__ = ["dense_reference", "compare_with_dense", "device_mesh", "call", "loss_of", "LR", "EPS"]

LR, EPS = 1e-3, 1e-6  # AdamW; eps above torch's 1e-8, see `planner verify --help` (--adam-eps)
Build = Callable[[], tuple[nn.Module, Any]]


def call(model: nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def loss_of(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "loss"):
        return out["loss"]
    return out[0]


def _train(model: nn.Module, inputs: Any, steps: int) -> list[float]:
    """`steps` AdamW steps from the gradients already in `model`; the loss after each step."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    losses = []
    for k in range(steps):
        opt.step()
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(k + 1 < steps):
            loss = loss_of(call(model, inputs))
        losses.append(loss.item())
        if k + 1 < steps:
            loss.backward()
    return losses


def dense_reference(build: Build, steps: int) -> dict[str, Any]:
    """The dense model's loss, gradients, losses after each AdamW step and final state dict."""
    model, inputs = build()
    loss = loss_of(call(model, inputs))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": loss.item(), "grads": grads, "step_losses": _train(model, inputs, steps),
            "state": {k: v.clone() for k, v in model.state_dict().items()}}


_MESHES: dict[Mesh, DeviceMesh] = {}


def device_mesh(mesh: Mesh) -> DeviceMesh:
    """One DeviceMesh per mesh shape in this process (creating its process groups is the slow part)."""
    if mesh not in _MESHES:
        _MESHES[mesh] = DeviceMesh(mesh)
    return _MESHES[mesh]


def compare_with_dense(build: Build, plan: Plan, ref: dict[str, Any], *, inputs_mode: str = "full") -> dict[str, Any]:
    """See the module docstring; `ref` is `dense_reference(build, steps)`."""
    dense, inputs = build()
    parallel = apply_plan(dense, plan, inputs=inputs_mode, mesh=device_mesh(plan.mesh))
    with CommCounter() as counter:
        with SavedActivationMeter.for_module(parallel) as meter:
            loss = loss_of(call(parallel, inputs))
        loss.backward()
    grad_err = {n: rel_error(g, ref["grads"][n]) for n, g in gather_grads(parallel).items()}
    out: dict[str, Any] = {
        "loss": (ref["loss"], loss.item()),
        "grad_error": max(grad_err.values()),
        "worst_grad": max(grad_err, key=grad_err.get),
        "grads_compared": len(grad_err),
        "measured_comm": dict(by_kind([c for c in counter.records if c.tag not in ("io", "tied")])),
        "predicted_comm": dict(by_kind(predicted_collectives(parallel.source_graph, plan).collectives)),
        "unplanned_comm": {tag: sum(c.bytes for c in counter.records if c.tag == tag) for tag in ("io", "tied")},
        "activation_bytes": meter.bytes,
        "predicted_activation_bytes": plan.predicted.activation_bytes,
    }
    out["step_losses"] = list(zip(ref["step_losses"], _train(parallel, inputs, len(ref["step_losses"]))))
    state, want = gather_state_dict(parallel), ref["state"]
    out["state_keys_equal"] = list(state) == list(want)
    floats = [k for k in want if want[k].is_floating_point()]
    floor = max(want[k].abs().max().item() for k in floats)
    errs = {k: rel_error(state[k], want[k], floor) for k in floats}
    out["state_error"] = max(errs.values())
    out["worst_state"] = max(errs, key=errs.get)
    out["nonfloat_equal"] = all(torch.equal(state[k], want[k]) for k in want if k not in floats)
    return out
