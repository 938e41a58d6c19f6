"""One SGD step of a zoo model, dense and planned, compared (shared by tests/zoo_models/test_zoo_fallback.py and
tests/test_cost_models/test_conv.py): `_dense` in the parent, `_rank` on every rank, `_check` on rank 0's results
(loss, per-tensor gradients and state after the step within TOL, every key and non-float buffer equal,
measured collectives equal to the predicted ones)."""

from __future__ import annotations

from typing import Any

import torch
import zoo
from apply_checks import call, device_mesh, loss_of

from planner.plans.format import Plan

__all__ = ["LR", "TOL", "_dense", "_rank", "_check"]

LR, TOL = 0.1, 1e-5  # the SGD step and the relative tolerance (per tensor, floor 1e-3 of its largest value)


def _errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, float]:
    floats = {k: v for k, v in want.items() if v.is_floating_point()}
    floor = 1e-3 * max(v.abs().max().item() for v in floats.values())
    out = {}
    for k, v in floats.items():
        diff = (got[k].double() - v.double()).abs().max().item()
        out[k] = diff / max(v.abs().max().item(), floor)
    return out


def _dense(name: str) -> dict[str, Any]:
    ex = zoo.build(name)
    loss = loss_of(call(ex.model, ex.example_inputs))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in ex.model.named_parameters()}
    torch.optim.SGD(ex.model.parameters(), lr=LR).step()
    return {"loss": loss.item(), "grads": grads, "state": {k: v.clone() for k, v in ex.model.state_dict().items()}}


def _rank(rank: int, name: str, plans: dict[str, Plan], ref: dict[str, Any]) -> dict[str, Any]:
    from layers3d.comm import CommCounter
    from planner.apply.rewrite import apply_plan
    from planner.apply.state import gather_grads, gather_state_dict
    from planner.verify.predict import by_kind, predicted_collectives

    out = {}
    for scheme, p in plans.items():
        ex = zoo.build(name)
        parallel = apply_plan(ex.model, p, mesh=device_mesh(p.mesh))
        with CommCounter() as counter:
            loss = loss_of(call(parallel, ex.example_inputs))
            loss.backward()
        grads = _errors(gather_grads(parallel), ref["grads"])
        torch.optim.SGD(parallel.parameters(), lr=LR).step()
        state = gather_state_dict(parallel)
        nonfloat = [k for k, v in ref["state"].items() if not v.is_floating_point()]
        out[scheme] = {
            "loss": loss.item(), "grads": grads, "state": _errors(state, ref["state"]),
            "keys": list(state) == list(ref["state"]),
            "nonfloat": all(torch.equal(state[k], ref["state"][k]) for k in nonfloat),
            "measured": dict(by_kind([c for c in counter.records if c.tag not in ("io", "tied")])),
            "predicted": dict(by_kind(predicted_collectives(parallel.source_graph, p).collectives)),
        }
    return out


def _check(name: str, results: dict[str, Any], ref: dict[str, Any]) -> None:
    for scheme, r in results.items():
        where = f"{name} {scheme}"
        assert abs(r["loss"] - ref["loss"]) <= TOL * abs(ref["loss"]), where
        worst = max(r["grads"], key=r["grads"].get)
        assert r["grads"][worst] <= TOL, f"{where}: gradient of {worst} off by {r['grads'][worst]:.2e}"
        worst = max(r["state"], key=r["state"].get)
        assert r["state"][worst] <= TOL, f"{where}: {worst} after a step off by {r['state'][worst]:.2e}"
        assert r["keys"] and r["nonfloat"], where
        assert r["measured"] == r["predicted"], where


