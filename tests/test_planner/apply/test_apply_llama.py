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
from apply_checks import compare_with_dense, dense_reference
from apply_plans import HARDWARE, uniform_plan
from distributed import run_ranks
from zoo import ZOO, build

from cost_models.mesh import Mesh
from planner.api import plan
from planner.plans.format import Plan
from planner.trace.graph import ModelGraph
from planner.trace.tracer import capture

pytestmark = pytest.mark.distributed

TOL = 1e-5
STEPS = 2
LLAMAS = ("hf-llama", "hf-mistral", "hf-qwen2", "hf-gpt-neox", "titan-llama")
# What may run without a strategy: mask and position-id arithmetic on integers, buffers, label padding.
_FAMILY_OPS = ("scaled_dot_product_attention", "rms_norm", "cat", "stack", "expand", "view_as", "type_as",
               "silu", "split", "chunk", "pow", "rsqrt", "mul", "linear", "layer_norm", "embedding")


def _builder(name: str) -> Any:
    def make() -> tuple[Any, Any]:
        ex = build(name)
        return ex.model, ex.example_inputs
    return make


def forced_plan(graph: ModelGraph) -> Plan:
    """The planner's own plan on 8 ranks in a row at half the replicated plan's peak (so something must be
    sharded; one mesh shape keeps the solve short on 2 busy cores)."""
    budget = uniform_plan(graph, "replicate").predicted.peak_memory_bytes // 2
    return plan(graph, budget, world_size=8, hardware=HARDWARE, device="cpu", meshes=[Mesh((8,))])


def _plans(cases: dict[str, tuple[str, ...]]) -> dict[tuple[str, str], Plan]:
    out = {}
    for name, schemes in cases.items():
        model, inputs = _builder(name)()
        graph = capture(model, inputs)
        for s in schemes:
            out[(name, s)] = forced_plan(graph) if s == "mixed" else uniform_plan(graph, s)
    return out


def _ranks(rank: int, plans: dict[tuple[str, str], Plan], refs: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {key: compare_with_dense(_builder(key[0]), p, refs[key[0]]) for key, p in plans.items()}


def run_cases(cases: dict[str, tuple[str, ...]]) -> dict[tuple[str, str], dict[str, Any]]:
    plans = _plans(cases)
    refs = {name: dense_reference(_builder(name), STEPS) for name in cases}
    per_rank = run_ranks(_ranks, 8, timeout_s=900, args=(plans, refs))
    return {key: {**per_rank[0][key], "plan": plans[key]} for key in plans}


def check(key: tuple[str, str], r: dict[str, Any]) -> None:
    dense, parallel = r["loss"]
    assert abs(parallel - dense) <= TOL * abs(dense), key
    assert r["grad_error"] <= TOL, f"{key}: {r['worst_grad']} off by {r['grad_error']:.2e}"
    assert r["grads_compared"] > 0
    for d, p in r["step_losses"]:
        assert abs(p - d) <= TOL * abs(d), (key, r["step_losses"])
    assert r["state_keys_equal"] and r["nonfloat_equal"], key
    assert r["state_error"] <= TOL, f"{key}: {r['worst_state']} off by {r['state_error']:.2e}"
    assert r["measured_comm"] == r["predicted_comm"], key
    measured, predicted = r["activation_bytes"], r["predicted_activation_bytes"]
    assert abs(measured - predicted) <= 0.05 * measured, (key, measured, predicted)
    p: Plan = r["plan"]
    kinds = {a.kind for a in p.assignments}
    assert {"attention", "linear", "embedding"} <= kinds, key
    other = [a.target for a in p.assignments if a.kind == "other"]
    assert not [t for t in other if any(f in t for f in _FAMILY_OPS)], (key, other)


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
    model, inputs = _builder("hf-llama")()
    p = uniform_plan(capture(model, inputs), "3d")
    by_kind = {a.kind for a in p.assignments}
    assert {"rms_norm", "attention", "cat", "expand"} <= by_kind
    attention = [a for a in p.assignments if a.kind == "attention"]
    # heads split over the tensor axes, batch over the data axes: no conversion into or out of it
    assert all(a.inputs[0].dims[1] for a in attention), [str(a.inputs[0]) for a in attention]


def test_titan_llama_plans_head_parallel() -> None:
    """The torchtitan-style Llama (nn.RMSNorm, complex RoPE, type_as, repeat_kv, SDPA) plans under 3d with
    its attention split by heads and every family op given a strategy."""
    model, inputs = _builder("titan-llama")()
    p = uniform_plan(capture(model, inputs), "3d")
    kinds = {a.kind for a in p.assignments}
    assert {"rms_norm", "attention", "complex_view", "expand", "linear"} <= kinds
    other = [a.target for a in p.assignments if a.kind == "other"]
    assert not [t for t in other if any(f in t for f in _FAMILY_OPS)], other
    attention = [a for a in p.assignments if a.kind == "attention"]
    assert all(a.inputs[0].dims[1] for a in attention), [str(a.inputs[0]) for a in attention]


@pytest.mark.slow
@pytest.mark.parametrize("name", LLAMAS)
def test_every_scheme_matches_dense(name: str) -> None:
    results = run_cases({name: ZOO[name].schemes + ("mixed",)})
    for key, r in results.items():
        check(key, r)
