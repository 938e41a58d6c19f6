"""The Llama-family cases shared by tests/test_planner/apply/test_apply_llama.py and bench/llama_acceptance.py:
the zoo's Llama models planned (uniform schemes, or the planner's own plan at a budget that forces
sharding), applied on 8 forked gloo ranks and compared with the dense model (`run_cases`), and the
acceptance check of one case (`check`)."""

from __future__ import annotations

from typing import Any

from apply_checks import compare_with_dense, dense_reference
from apply_plans import HARDWARE, uniform_plan
from distributed import run_ranks
from zoo import build

from cost_models.mesh import Mesh
from planner.api import plan
from planner.plans.format import Plan
from planner.trace.graph import ModelGraph
from planner.trace.tracer import capture

__all__ = ["LLAMAS", "STEPS", "TOL", "FAMILY_OPS", "builder", "check", "forced_plan", "run_cases"]

TOL = 1e-5
STEPS = 2
LLAMAS = ("hf-llama", "hf-mistral", "hf-qwen2", "hf-gpt-neox", "titan-llama")
# What may run without a strategy: mask and position-id arithmetic on integers, buffers, label padding.
FAMILY_OPS = ("scaled_dot_product_attention", "rms_norm", "cat", "stack", "expand", "view_as", "type_as",
               "silu", "split", "chunk", "pow", "rsqrt", "mul", "linear", "layer_norm", "embedding")


def builder(name: str) -> Any:
    """A zero-argument factory of the zoo model `name` and its example inputs."""
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
        model, inputs = builder(name)()
        graph = capture(model, inputs)
        for s in schemes:
            out[(name, s)] = forced_plan(graph) if s == "mixed" else uniform_plan(graph, s)
    return out


def _ranks(rank: int, plans: dict[tuple[str, str], Plan], refs: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {key: compare_with_dense(builder(key[0]), p, refs[key[0]]) for key, p in plans.items()}


def run_cases(cases: dict[str, tuple[str, ...]]) -> dict[tuple[str, str], dict[str, Any]]:
    """{(model, scheme or "mixed"): rank 0's comparison with the dense model, plus the plan}, all cases in
    one forked 8-rank job."""
    plans = _plans(cases)
    refs = {name: dense_reference(builder(name), STEPS) for name in cases}
    per_rank = run_ranks(_ranks, 8, timeout_s=900, args=(plans, refs))
    return {key: {**per_rank[0][key], "plan": plans[key]} for key in plans}


def check(key: tuple[str, str], r: dict[str, Any]) -> None:
    """Assert one case's acceptance: loss, gradients and parameters after the steps within TOL, measured
    collectives equal to the prediction, saved activations within 5 %, no family op left replicated."""
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
    assert not [t for t in other if any(f in t for f in FAMILY_OPS)], (key, other)
