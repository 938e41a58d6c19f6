"""The Llama family planned, applied on 8 gloo ranks and compared with the dense model.

Models from the zoo (tests/zoo/llama.py): HF Llama with grouped-query attention, Mistral, Qwen2, GPT-NeoX
and a torchtitan-style Llama in plain torch. For each plan: loss, gradients and the parameters after two
AdamW steps equal the dense model's, the measured collective bytes per (kind, phase) equal the prediction,
the saved activations are within 5 % of it, and none of the family's ops (RMSNorm, attention, rotary
cat / complex views, repeat_kv's expand, SwiGLU) is left without a strategy.

Plans: uniform schemes (`planner.api.plan` restricted to one scheme) and the planner's own plan at a
budget that forces sharding (half of what the replicated model needs). One forked job per test runs all
of its plans; the default run applies HF Llama under the forced plan and plans HF Llama under 3d and the
torchtitan-style Llama (capture through torch.export costs seconds per rank and plan), the sweep over every
model and scheme (all passing when last run) is slow.
"""

from __future__ import annotations

from typing import Any

import pytest
from apply_plans import uniform_plan
from llama_cases import FAMILY_OPS, LLAMAS, builder, check, run_cases
from zoo import ZOO

from planner.plans.format import Plan
from planner.trace.tracer import capture

pytestmark = pytest.mark.distributed

DEFAULT = {"hf-llama": ("mixed",)}


@pytest.fixture(scope="module")
def default_results() -> dict[tuple[str, str], dict[str, Any]]:
    return run_cases(DEFAULT)


@pytest.mark.parametrize("key", [(m, s) for m, ss in DEFAULT.items() for s in ss], ids=lambda k: f"{k[0]}-{k[1]}")
def test_matches_dense(default_results: dict[tuple[str, str], dict[str, Any]], key: tuple[str, str]) -> None:
    check(key, default_results[key])


def test_forced_plan_shards_and_fits(default_results: dict[tuple[str, str], dict[str, Any]]) -> None:
    p: Plan = default_results[("hf-llama", "mixed")]["plan"]
    assert p.feasible and p.predicted.peak_memory_bytes <= p.budget_bytes
    heavy = {a.scheme for a in p.assignments if a.kind == "linear"}
    assert heavy - {"replicate"}, heavy


def test_llama_ops_have_strategies() -> None:
    model, inputs = builder("hf-llama")()
    p = uniform_plan(capture(model, inputs), "3d")
    by_kind = {a.kind for a in p.assignments}
    assert {"rms_norm", "attention", "cat", "expand"} <= by_kind
    attention = [a for a in p.assignments if a.kind == "attention"]
    # heads split over the tensor axes, batch over the data axes: no conversion into or out of it
    assert all(a.inputs[0].dims[1] for a in attention), [str(a.inputs[0]) for a in attention]


def test_titan_llama_plans_head_parallel() -> None:
    """The torchtitan-style Llama (nn.RMSNorm, complex RoPE, type_as, repeat_kv, SDPA) plans under 3d with
    its attention split by heads and every family op given a strategy."""
    model, inputs = builder("titan-llama")()
    p = uniform_plan(capture(model, inputs), "3d")
    kinds = {a.kind for a in p.assignments}
    assert {"rms_norm", "attention", "complex_view", "expand", "linear"} <= kinds
    other = [a.target for a in p.assignments if a.kind == "other"]
    assert not [t for t in other if any(f in t for f in FAMILY_OPS)], other
    attention = [a for a in p.assignments if a.kind == "attention"]
    assert all(a.inputs[0].dims[1] for a in attention), [str(a.inputs[0]) for a in attention]


@pytest.mark.slow
@pytest.mark.parametrize("name", LLAMAS)
def test_every_scheme_matches_dense(name: str) -> None:
    results = run_cases({name: ZOO[name].schemes + ("mixed",)})
    for key, r in results.items():
        check(key, r)
