"""Dropout in training under `planner verify` (8 gloo ranks, one forked job).

* HF GPT-2 (the hf-gpt2 example keeps GPT2Config's default dropout 0.1) under a 3d plan: verify passes:
  numerics with dropout off in both models, the masks following the rule (equal where ranks hold the
  same elements, independent elsewhere), saved activations (with the masks) as predicted.
* The same plan with the rule broken (every rank seeds every dropout alike, whatever elements it holds):
  verify fails on the masks, naming the dropout ops.
* A checkpointed block recomputes the same masks: loss and gradients of a checkpointed plan with
  dropout equal those of the same plan without checkpointing, with the same seeds.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from apply_checks import call, device_mesh, loss_of
from apply_plans import uniform_plan
from distributed import run_ranks

from layers3d.dropout import ParallelDropout
from planner.apply.rewrite import apply_plan
from planner.apply.state import gather_grads
from planner.models.hf_gpt2 import build_hf_gpt2
from planner.plans.format import Plan
from planner.trace.tracer import capture
from planner.verify.run import run_verify

pytestmark = pytest.mark.distributed


def _same_seed_everywhere(parallel: torch.nn.Module) -> None:
    for m in parallel.modules():
        if isinstance(m, ParallelDropout):
            m._salt = 12345


def _grads(plan: Plan) -> tuple[float, dict[str, torch.Tensor]]:
    model, inputs = build_hf_gpt2(seed=0)
    parallel = apply_plan(model, plan, mesh=device_mesh(plan.mesh))
    torch.manual_seed(7)
    loss = loss_of(call(parallel, inputs))
    loss.backward()
    return loss.item(), gather_grads(parallel)


def _ranks(rank: int, path: str, plan: Plan, ckpt: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case, prepare in (("rule", None), ("broken", _same_seed_everywhere)):
        buf = io.StringIO()
        out[case] = (run_verify("hf-gpt2", path, steps=1, out=buf, prepare=prepare), buf.getvalue())
    out["plain"], out["ckpt"] = _grads(plan), _grads(ckpt)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    model, inputs = build_hf_gpt2(seed=0)
    assert model.config.resid_pdrop == 0.1
    graph = capture(model, inputs)
    plan = uniform_plan(graph, "3d")
    path = tmp_path_factory.mktemp("dropout") / "plan.json"
    plan.save(path)
    ckpt = Plan.from_dict({**plan.to_dict(), "checkpoint": ["transformer.h.0", "transformer.h.1"]})
    return run_ranks(_ranks, 8, timeout_s=900, args=(str(Path(path)), plan, ckpt))[0]


def test_verify_passes_with_dropout_on(results: dict[str, Any]) -> None:
    status, text = results["rule"]
    assert "dropout: 7 op(s) with p > 0" in text and "compare dense and parallel with dropout off" in text
    assert "kept 1 - p): ok" in text, text
    assert status == 0, text


def test_verify_fails_when_the_mask_rule_is_broken(results: dict[str, Any]) -> None:
    status, text = results["broken"]
    assert status == 1
    assert "kept 1 - p): FAIL" in text
    assert "ranks holding different elements drew the same mask" in text, text


def test_checkpointed_blocks_recompute_the_same_masks(results: dict[str, Any]) -> None:
    (loss, grads), (loss_ck, grads_ck) = results["plain"], results["ckpt"]
    assert loss == loss_ck
    for name, g in grads.items():
        torch.testing.assert_close(grads_ck[name], g, rtol=1e-5, atol=1e-7, msg=name)
