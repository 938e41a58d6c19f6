"""apply_plan beyond the drop-in case, on 8 gloo ranks (one forked job): data-parallel batch shards in and
out, a model on the meta device built shard by shard, plans refused before anything is built, and the
residual MLP example, whose first linear reads a graph input (no input gradient, so no dX collectives)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from apply_checks import compare_with_dense, dense_reference
from apply_plans import mixed_plan, uniform_plan
from distributed import run_ranks

from layers3d.shard import local_block
from planner.apply.rewrite import PlanMismatchError, apply_plan
from planner.apply.state import gather_grads, gather_state_dict
from planner.models.gpt import build_gpt
from planner.models.loading import get_example
from planner.plans.format import Plan, PlanError
from planner.trace.tracer import capture
from planner.verify.report import rel_error

pytestmark = pytest.mark.distributed

TOL = 1e-5


def _sharded(rank: int, p_loss: Plan, p_logits: Plan) -> dict[str, float]:
    """Each rank passes its eighth of the batch; the loss is the full batch's, the logits its rows."""
    model, (ids, targets) = build_gpt("gpt-tiny", seed=0)
    rows = slice(rank, rank + 1)  # batch 8 over 8 ranks
    dense_loss = model(ids, targets)
    dense_loss.backward()
    parallel = apply_plan(model, p_loss, inputs="sharded")
    loss = parallel(ids[rows], targets[rows])
    loss.backward()
    params = dict(model.named_parameters())
    grad_err = max(rel_error(g, params[n].grad) for n, g in gather_grads(parallel).items())
    dense_logits = model(ids)
    logits = apply_plan(model, p_logits, inputs="sharded")(ids[rows])
    return {"loss": rel_error(loss, dense_loss), "grads": grad_err, "logits": rel_error(logits, dense_logits[rows]),
            "logits_rows": logits.shape[0]}


def _meta(rank: int, plan: Plan) -> dict[str, Any]:
    """A model on the meta device: every rank initialises only its blocks; replicas agree."""
    real, (ids, targets) = build_gpt("gpt-tiny", seed=0)
    model, _ = build_gpt("gpt-tiny", device="meta")
    for name, buf in real.named_buffers():  # the causal masks: a model's buffers must be real
        owner = model.get_submodule(name.rsplit(".", 1)[0])
        setattr(owner, name.rsplit(".", 1)[1], buf)
    parallel = apply_plan(model, plan)
    loss = parallel(ids, targets)
    loss.backward()
    state = gather_state_dict(parallel)
    mesh = parallel.device_mesh
    replicas_agree = all(
        torch.equal(local_block(state[name], home.dims, mesh.mesh, rank, interleave=home.interleave,
                                interleave_dim=home.interleave_dim), home.local.detach())
        for name, home in parallel.homes.items())
    return {"loss": loss.item(), "shapes": {k: tuple(v.shape) for k, v in state.items()},
            "dense_shapes": {k: tuple(v.shape) for k, v in real.state_dict().items()},
            "replicas_agree": replicas_agree, "ln_weight": state["transformer.ln_f.weight"].unique().tolist(),
            "bias_zero": bool((state["transformer.h.0.attn.c_attn.bias"] == 0).all()),
            "on_meta": any(p.device.type == "meta" for p in parallel.parameters())}


def _refusals(rank: int, plan: Plan, other_world: Plan) -> dict[str, str]:
    out = {}
    model, _ = build_gpt("gpt-tiny", seed=0)
    before = copy.deepcopy(model.state_dict())
    smaller, _ = build_gpt("gpt-tiny", seed=0, n_layer=1)
    old = copy.copy(plan)
    old.schema_version = 0
    for name, (m, p) in {"model": (smaller, plan), "world": (model, other_world), "schema": (model, old)}.items():
        try:
            apply_plan(m, p)
            out[name] = "applied"
        except PlanMismatchError as e:
            out[name] = str(e)
    out["untouched"] = str(all(torch.equal(before[k], v) for k, v in model.state_dict().items()))
    return out


def _mlp() -> tuple[torch.nn.Module, Any]:
    ex = get_example("mlp", seed=0)
    return ex.model, ex.example_inputs


MLP_SCHEMES = ("fsdp", "3d")


def _ranks(rank: int, plans: dict[str, Plan], mlp_ref: dict[str, Any]) -> dict[str, Any]:
    return {"sharded": _sharded(rank, plans["mixed"], plans["logits"]), "meta": _meta(rank, plans["3d"]),
            "refusals": _refusals(rank, plans["3d"], plans["four"]),
            "mlp": {s: compare_with_dense(_mlp, plans[f"mlp_{s}"], mlp_ref) for s in MLP_SCHEMES}}


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    model, (ids, targets) = build_gpt("gpt-tiny", seed=0)
    graph = capture(model, (ids, targets))
    plans = {"mixed": mixed_plan(graph), "3d": uniform_plan(capture(model, (ids, targets)), "3d"),
             "logits": uniform_plan(capture(model, (ids,)), "3d")}
    from planner.api import plan

    plans["four"] = plan(capture(model, (ids, targets)), "1GiB", world_size=4, hardware="cpu-gloo")
    mlp, mlp_inputs = _mlp()
    for s in MLP_SCHEMES:
        plans[f"mlp_{s}"] = uniform_plan(capture(mlp, mlp_inputs), s)
    return run_ranks(_ranks, 8, timeout_s=600, args=(plans, dense_reference(_mlp, 2)))


def test_sharded_inputs_give_the_full_batch_loss_and_row_blocks(results: list[dict[str, Any]]) -> None:
    for r in results:
        s = r["sharded"]
        assert s["loss"] <= TOL and s["grads"] <= TOL and s["logits"] <= TOL
        assert s["logits_rows"] == 1


def test_meta_model_is_built_shard_by_shard(results: list[dict[str, Any]]) -> None:
    losses = {r["meta"]["loss"] for r in results}
    assert len(losses) == 1 and 4.0 < losses.pop() < 5.5  # ln(128) = 4.85 for a fresh model
    for r in results:
        m = r["meta"]
        assert m["shapes"] == m["dense_shapes"]
        assert m["replicas_agree"] and not m["on_meta"]
        assert m["ln_weight"] == [1.0] and m["bias_zero"]


def test_mismatched_plans_are_refused_before_building(results: list[dict[str, Any]]) -> None:
    for r in results:
        f = r["refusals"]
        assert "another model" in f["model"] and "fingerprint" in f["model"]
        assert "for 4 ranks" in f["world"] and "has 8" in f["world"]
        assert "schema_version 0" in f["schema"]
        assert f["untouched"] == "True"


@pytest.mark.parametrize("scheme", MLP_SCHEMES)
def test_mlp_with_an_input_without_gradient(results: list[dict[str, Any]], scheme: str) -> None:
    r = results[0]["mlp"][scheme]
    assert abs(r["loss"][1] - r["loss"][0]) <= TOL * r["loss"][0]
    assert r["grad_error"] <= TOL and r["state_error"] <= TOL
    assert all(abs(p - d) <= TOL * d for d, p in r["step_losses"])
    assert r["measured_comm"] == r["predicted_comm"]
    assert r["activation_bytes"] == r["predicted_activation_bytes"]


def test_an_older_plan_file_does_not_load(tmp_path: Any) -> None:
    model, inputs = build_gpt("gpt-tiny", seed=0)
    p = uniform_plan(capture(model, inputs), "replicate")
    data = p.to_dict()
    data["schema_version"] = 0
    with pytest.raises(PlanError, match="older planner"):
        Plan.from_dict(data)
