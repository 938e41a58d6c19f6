"""`planner verify` on deliberately broken parallel models: it fails and names the broken tensor; a
gradient that is zero in exact arithmetic never fails it.

hf-bert (zoo) under the fsdp plan on 4 gloo ranks (tokens split over the 4 ranks, every gradient reduced over
them), three runs of `run_verify` in one forked job:

* clean: the gradients row passes, although the attention key biases hold rounding noise whose two
  summation orders differ by ~100 % on their own scale (the old check named key.bias its worst FAIL);
* one bias gradient scaled by 0.5 (a hook on that parameter): gradients FAIL, that bias listed;
* one LayerNorm bias gradient left un-reduced (its data-parallel all-reduce skipped): gradients FAIL,
  that bias listed first.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from apply_plans import uniform_plan
from distributed import run_ranks
from zoo import ZOO
from zoo_checks import make

import layers3d.norm
from planner.trace.tracer import capture
from planner.verify.run import run_verify

pytestmark = pytest.mark.distributed

SPEC = "zoo.encoders:hf_bert"
SCALED = "bert.encoder.layer.1.output.dense.bias"
UNREDUCED = "bert.encoder.layer.0.attention.output.LayerNorm.bias"
RANKS = 4  # tokens split over 4 ranks: enough for two summation orders; 8 forked ranks cost 2x on 2 cores


def _scale_half(parallel: torch.nn.Module) -> None:
    parallel.get_parameter(SCALED).register_hook(lambda g: 0.5 * g)


def _verify(plan_path: str, prepare: Any = None) -> tuple[int, str]:
    out = io.StringIO()
    status = run_verify(SPEC, plan_path, steps=1, out=out, prepare=prepare)
    return status, out.getvalue()


def _ranks(rank: int, plan_path: str) -> dict[str, tuple[int, str]]:
    res = {"clean": _verify(plan_path), "scaled": _verify(plan_path, _scale_half)}
    target: list[torch.Tensor] = []
    reduce_grad = layers3d.norm.reduce_grad

    def skip_one(p: torch.Tensor, axes: Any, mesh: Any, tag: str = "grad_weight") -> torch.Tensor:
        return p if target and p is target[0] else reduce_grad(p, axes, mesh, tag)

    layers3d.norm.reduce_grad = skip_one
    try:
        res["unreduced"] = _verify(plan_path, lambda m: target.append(m.get_parameter(UNREDUCED)))
    finally:
        layers3d.norm.reduce_grad = reduce_grad
    return res


def _row(text: str, what: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(what))


def _failing(text: str) -> list[str]:
    return [line.split()[-1] for line in text.splitlines() if line.strip().startswith("FAIL ")]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    if not ZOO["hf-bert"].available():
        pytest.skip("hf-bert needs transformers")
    path = tmp_path_factory.mktemp("broken") / "plan.json"
    uniform_plan(capture(*make("hf-bert")), "fsdp", world_size=RANKS).save(path)
    return run_ranks(_ranks, RANKS, timeout_s=900, args=(str(Path(path)),))[0]


def test_zero_gradient_tensor_never_fails_verify(reports: dict[str, tuple[int, str]]) -> None:
    _, text = reports["clean"]
    for what in ("gradients", "parameters after 1 steps", "loss "):
        assert _row(text, what).split()[-2 if what != "loss " else 2] == "ok", text
    assert "key.bias" not in _row(text, "gradients")
    assert _failing(text) == []


def test_scaled_bias_gradient_fails_and_is_named(reports: dict[str, tuple[int, str]]) -> None:
    status, text = reports["scaled"]
    assert status == 1
    assert "FAIL" in _row(text, "gradients"), text
    assert _failing(text)[0] == SCALED, text
    assert "key.bias" not in " ".join(_failing(text))


def test_unreduced_gradient_fails_and_is_named(reports: dict[str, tuple[int, str]]) -> None:
    status, text = reports["unreduced"]
    assert status == 1
    assert "FAIL" in _row(text, "gradients"), text
    assert _failing(text)[0] == UNREDUCED, text
