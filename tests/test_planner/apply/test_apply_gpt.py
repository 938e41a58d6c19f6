"""apply_plan on gpt-tiny with 8 gloo ranks: every uniform scheme and a mixed, partly checkpointed plan give
the dense loss, gradients, AdamW trajectory and state dict, and exactly the communication the plan predicts.

All plans run in one forked 8-rank job (the ranks share the warmed-up parent), the tests read its results.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from apply_checks import compare_with_dense, dense_reference
from apply_plans import UNIFORM_SCHEMES, mixed_plan, uniform_plan
from distributed import run_ranks

from planner.models.gpt import build_gpt
from planner.trace.tracer import capture

pytestmark = pytest.mark.distributed

TOL = 1e-5
STEPS = 5
CASES = (*UNIFORM_SCHEMES, "mixed", "saved_shards")


def _shard_rule(op_name: str, module_path: str, kind: str, s: Any) -> bool:
    """Linears that keep their input shard and gather it again in backward: attention 2d, the MLP's first
    linear 1d_col with sequence parallelism (its second 1d_row with sp), the head 1d_col."""
    if kind == "linear":
        if ".attn." in module_path:
            return s.scheme == "2d" and s.option("save_input") == "shard"
        if module_path.endswith("c_fc"):
            return s.scheme == "1d_col" and bool(s.option("sp")) and s.option("save_input") == "shard"
        if ".mlp." in module_path:
            return s.scheme == "1d_row" and bool(s.option("sp"))
        return s.scheme == "1d_col"
    if kind == "embedding":
        return s.scheme == "vocab" if module_path.endswith("wte") else s.scheme == "replicate"
    return True


def _build() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    model, inputs = build_gpt("gpt-tiny", seed=0)
    return model, inputs


def _ranks(rank: int, plans: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    return {name: compare_with_dense(_build, p, ref) for name, p in plans.items()}


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    model, inputs = _build()
    graph = capture(model, inputs)  # also warms up capture before the ranks fork
    plans = {s: uniform_plan(graph, s) for s in UNIFORM_SCHEMES}
    plans["mixed"] = mixed_plan(capture(model, inputs))
    plans["saved_shards"] = mixed_plan(capture(model, inputs), checkpoint=(), rule=_shard_rule)
    ref = dense_reference(_build, STEPS)
    per_rank = run_ranks(_ranks, 8, timeout_s=600, args=(plans, ref))
    for r in per_rank[1:]:
        for name in plans:
            assert r[name]["loss"] == per_rank[0][name]["loss"], f"{name}: ranks disagree on the loss"
    return {name: {**per_rank[0][name], "plan": plans[name]} for name in plans}


def test_uniform_plans_use_their_scheme(results: dict[str, dict[str, Any]]) -> None:
    for scheme in UNIFORM_SCHEMES:
        want = {"1d_col", "1d_row"} if scheme == "1d" else {scheme}
        linears = {a.scheme for a in results[scheme]["plan"].assignments if a.kind == "linear"}
        assert linears <= want and linears, (scheme, linears)
    mixed = results["mixed"]["plan"]
    assert mixed.checkpoint == ["transformer.h.1"]
    assert {a.scheme for a in mixed.assignments if ".attn." in a.module_path and a.kind == "linear"} == {"3d"}
    assert {a.scheme for a in mixed.assignments if ".mlp." in a.module_path and a.kind == "linear"} == {"3d_allreduce"}
    assert {a.scheme for a in mixed.assignments if a.kind == "cross_entropy"} == {"vocab"}
    shards = results["saved_shards"]["plan"]
    kept = {(a.scheme, a.options.get("save_input")) for a in shards.assignments if a.kind == "linear"}
    assert {("2d", "shard"), ("1d_col", "shard")} <= kept, kept


@pytest.mark.parametrize("case", CASES)
def test_loss_and_gradients_equal_dense(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    dense, parallel = r["loss"]
    assert abs(parallel - dense) <= TOL * abs(dense)
    assert r["grads_compared"] == sum(1 for _ in _build()[0].parameters())
    assert r["grad_error"] <= TOL, f"{case}: gradient of {r['worst_grad']} off by {r['grad_error']:.2e}"


@pytest.mark.parametrize("case", CASES)
def test_adamw_steps_follow_dense(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    assert len(r["step_losses"]) == STEPS
    assert r["step_losses"][-1][0] < r["loss"][0]  # the steps do train
    for dense, parallel in r["step_losses"]:
        assert abs(parallel - dense) <= TOL * abs(dense), (case, r["step_losses"])


@pytest.mark.parametrize("case", CASES)
def test_gathered_state_dict_equals_dense(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    assert r["state_keys_equal"] and r["nonfloat_equal"]
    assert r["state_error"] <= TOL, f"{case}: {r['worst_state']} off by {r['state_error']:.2e}"


@pytest.mark.parametrize("case", CASES)
def test_saved_activations_match_the_prediction(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    assert abs(r["activation_bytes"] - r["predicted_activation_bytes"]) <= 0.05 * r["predicted_activation_bytes"]


@pytest.mark.parametrize("case", CASES)
def test_measured_communication_equals_prediction(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    assert r["measured_comm"] == r["predicted_comm"]
    if case != "replicate":
        assert sum(r["measured_comm"].values()) > 0
    if case == "mixed":
        assert any(phase == "recompute" for _, phase in r["measured_comm"])
