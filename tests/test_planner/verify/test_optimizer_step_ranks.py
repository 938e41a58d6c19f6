"""The optimizer step in plans, measured on 8 gloo ranks under cpu-gloo, on two models whose activations are
small beside their states: the built-in mlp at 640 KiB, and Hugging Face BERT (masked-LM head tied to the
word embedding; a model this project did not write) at batch 1 x 8 and 2 MiB. For each torch AdamW
implementation (`cost_models.optimizer`), the plan priced for it and trained with it (`optimizer_kwargs`)
never needs more than the bound its budget was checked against, but for a few kilobytes the model leaves
out (AdamW's step counters, 4 B per parameter tensor); with single-tensor or foreach AdamW the step is where
memory peaks, and the predicted peak is within 0.2 % of what every rank measures there. Before the step was
counted, single-tensor AdamW on the mlp measured 12.4 % above the predicted peak and 2 % above the bound;
before the tied weight's copy was taken off its layer after the forward (`TiedLayer`), BERT measured 6.9 %
above the prediction in the step.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
from distributed import run_ranks
from fidelity_cases import measure_rank
from zoo.encoders import hf_bert

from cost_models.ops import DTYPE_BYTES
from cost_models.optimizer import OPTIMIZER_IMPLS
from planner.api import plan
from planner.models.loading import get_example
from planner.plans.format import Plan

pytestmark = pytest.mark.distributed
BUDGETS = {"mlp": 640 * 1024, "hf-bert": 2 * 2**20}
CASES = [(model, impl) for model in BUDGETS for impl in OPTIMIZER_IMPLS]


def _build(model: str) -> tuple[Any, Any]:
    ex = get_example("mlp") if model == "mlp" else hf_bert(batch_size=1, seq_len=8)
    return ex.model, ex.example_inputs


def _ranks(rank: int, plans: dict[tuple[str, str], Plan]) -> dict[tuple[str, str], dict[str, Any]]:
    return {key: measure_rank(functools.partial(_build, key[0]), p) for key, p in plans.items()}


@pytest.fixture(scope="module")
def measured() -> tuple[dict[tuple[str, str], Plan], list[dict[tuple[str, str], dict[str, Any]]]]:
    plans = {}
    for model, impl in CASES:
        dense, inputs = _build(model)
        plans[(model, impl)] = plan(dense, BUDGETS[model], world_size=8, example_inputs=inputs, hardware="cpu-gloo",
                                    optimizer=impl, workers=1)
    return plans, run_ranks(_ranks, 8, timeout_s=600, args=(plans,))


@pytest.mark.parametrize("case", CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_plan_counts_the_optimizer_step(measured: Any, case: tuple[str, str]) -> None:
    plans, per_rank = measured
    p = plans[case]
    assert p.options.optimizer == case[1]
    held = sum(math.prod(i.shape) * DTYPE_BYTES[i.dtype] for i in p.model.inputs)  # the caller's batch
    assert (p.predicted.optimizer_bytes > held) == (case[1] != "fused") and p.predicted.optimizer_bytes >= held
    for rank, rows in enumerate(per_rank):
        r = rows[case]
        # never more than the bound the budget was checked against, but for the step counters
        assert r["predicted_bound"] <= BUDGETS[case[0]] and r["peak"] <= r["predicted_bound"] + 4096, f"rank {rank}: {r}"
        if case[1] == "fused":  # no temporaries of a parameter's size: the peak is in the backward
            assert r["peak_phase"] == "backward", f"rank {rank}: {r}"
        else:  # the step is the peak, within the step counters
            assert r["peak_phase"] == "optimizer step", f"rank {rank}: {r}"
            assert abs(r["peak"] - r["predicted_peak"]) <= 0.002 * r["predicted_peak"], f"rank {rank}: {r}"
