"""The optimizer step in plans, measured on 8 gloo ranks: the built-in mlp under cpu-gloo at 640 KiB on
2x2x2, whose activations are small beside its states. For each torch AdamW implementation
(`cost_models.optimizer`), the plan priced for it and trained with it (`optimizer_kwargs`) never needs more
than the bound its budget was checked against, but for a few hundred bytes the model leaves out (AdamW's
step counters); with single-tensor or foreach AdamW the step is where memory peaks, and the predicted peak
is within 0.1 % of what every rank measures there. Before the step was counted, single-tensor AdamW
measured 12.4 % above the predicted peak and 2 % above the bound: a plan said to fit that did not."""

from __future__ import annotations

from typing import Any

import pytest
from distributed import run_ranks
from fidelity_cases import measure_rank

from cost_models.optimizer import OPTIMIZER_IMPLS
from planner.api import plan
from planner.models.loading import get_example
from planner.plans.format import Plan

pytestmark = pytest.mark.distributed
BUDGET = 640 * 1024


def _build() -> tuple[Any, Any]:
    ex = get_example("mlp")
    return ex.model, ex.example_inputs


def _ranks(rank: int, plans: dict[str, Plan]) -> dict[str, dict[str, Any]]:
    return {impl: measure_rank(_build, p) for impl, p in plans.items()}


@pytest.fixture(scope="module")
def measured() -> tuple[dict[str, Plan], list[dict[str, dict[str, Any]]]]:
    model, inputs = _build()
    plans = {impl: plan(model, BUDGET, world_size=8, example_inputs=inputs, hardware="cpu-gloo", meshes=[(2, 2, 2)],
                        optimizer=impl, workers=1) for impl in OPTIMIZER_IMPLS}
    return plans, run_ranks(_ranks, 8, timeout_s=600, args=(plans,))


@pytest.mark.parametrize("impl", OPTIMIZER_IMPLS)
def test_plan_counts_the_optimizer_step(measured: Any, impl: str) -> None:
    plans, per_rank = measured
    p = plans[impl]
    assert p.options.optimizer == impl
    held = 32 * 64 * 4 + 32 * 8  # the caller's batch (float32 features, int64 targets), alive through the step
    assert (p.predicted.optimizer_bytes > held) == (impl != "fused")
    for rank, rows in enumerate(per_rank):
        r = rows[impl]
        # never more than the bound the budget was checked against, but for a few hundred bytes the model leaves
        # out (AdamW's step counters, 4 B per parameter tensor, and scalars)
        assert r["predicted_bound"] <= BUDGET and r["peak"] <= r["predicted_bound"] + 512, f"rank {rank}: {r}"
        if impl == "fused":  # no temporaries of a parameter's size: the peak is in the backward
            assert r["peak_phase"] == "backward" and r["peak"] <= r["predicted_peak"], f"rank {rank}: {r}"
        else:  # the step is the peak, within a few bytes (step counters)
            assert r["peak_phase"] == "optimizer step", f"rank {rank}: {r}"
            assert abs(r["peak"] - r["predicted_peak"]) <= 0.001 * r["predicted_peak"], f"rank {rank}: {r}"
