"""apply_plan on Hugging Face GPT-2 (captured with torch.export) with 8 gloo ranks.

* GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4)) with the plan `plan()` picks: loss,
  gradients, 5 AdamW steps and the gathered state dict equal the dense model's, and the collectives equal
  the prediction.
* The small-vocabulary hf-gpt2 example with its tied embedding/head put in *different* layouts (embedding
  vocab-parallel, head row-parallel): the head reads the embedding's parameter through a redistribution,
  and the gradients of both uses add up in the one parameter.

Dropout is 0 (a dense and a parallel run draw different masks). One forked job runs both cases.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from apply_checks import compare_with_dense, dense_reference
from apply_plans import mixed_plan
from distributed import run_ranks

from planner.api import plan
from planner.models.hf_gpt2 import build_hf_gpt2
from planner.trace.tracer import capture

pytestmark = pytest.mark.distributed

TOL = 1e-5
STEPS = 5
NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def build_gpt2() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4)) without dropout, eager attention."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, attn_implementation="eager", **NO_DROPOUT)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, config.vocab_size, (8, 16), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids.clone()}


def build_tied() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The hf-gpt2 example (vocab 256, tied head) without dropout, batch 8."""
    return build_hf_gpt2(seed=0, batch_size=8, seq_len=16, **NO_DROPOUT)


def _tie_rule(name: str, module_path: str, kind: str, s: Any) -> bool:
    if kind == "embedding":
        return s.scheme == "vocab" if module_path.endswith("wte") else s.scheme == "replicate"
    if kind == "linear":
        if module_path == "lm_head":
            return s.scheme == "1d_row"
        return s.scheme == ("3d" if ".attn." in module_path else "3d_allreduce")
    return True


BUILDERS = {"gpt2": build_gpt2, "tied": build_tied}


def _ranks(rank: int, plans: dict[str, Any], refs: dict[str, Any]) -> dict[str, Any]:
    return {name: compare_with_dense(BUILDERS[name], p, refs[name]) for name, p in plans.items()}


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    model, inputs = build_gpt2()
    plans = {"gpt2": plan(model, "1GiB", world_size=8, example_inputs=inputs)}
    model, inputs = build_tied()
    plans["tied"] = mixed_plan(capture(model, inputs), checkpoint=(), rule=_tie_rule)
    refs = {name: dense_reference(BUILDERS[name], STEPS) for name in plans}
    per_rank = run_ranks(_ranks, 8, timeout_s=600, args=(plans, refs))
    return {name: {**per_rank[0][name], "plan": plans[name]} for name in plans}


@pytest.mark.parametrize("case", ["gpt2", "tied"])
def test_matches_dense(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    dense, parallel = r["loss"]
    assert abs(parallel - dense) <= TOL * abs(dense)
    assert r["grad_error"] <= TOL, f"{case}: {r['worst_grad']} off by {r['grad_error']:.2e}"
    for d, p in r["step_losses"]:
        assert abs(p - d) <= TOL * abs(d), r["step_losses"]
    assert r["step_losses"][-1][0] < dense
    assert r["state_keys_equal"] and r["nonfloat_equal"]
    assert r["state_error"] <= TOL, f"{case}: {r['worst_state']} off by {r['state_error']:.2e}"


@pytest.mark.parametrize("case", ["gpt2", "tied"])
def test_communication_equals_prediction(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    assert r["measured_comm"] == r["predicted_comm"]


def test_tied_weight_is_read_through_a_redistribution(results: dict[str, dict[str, Any]]) -> None:
    p = results["tied"]["plan"]
    by_node = {a.node: a for a in p.assignments}
    embedding = next(a for a in p.assignments if a.kind == "embedding" and a.module_path.endswith("wte"))
    head = next(a for a in p.assignments if a.module_path == "lm_head" and a.kind == "linear")
    assert embedding.scheme == "vocab" and head.scheme == "1d_row"
    assert embedding.params["weight"] != head.params["weight"]
    assert results["tied"]["unplanned_comm"]["tied"] > 0
    assert by_node  # the plan names both ops
