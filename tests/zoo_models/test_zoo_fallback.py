"""Zoo part two (tests/zoo: torch CNN, LSTM LM, TransformerEncoder classifier, HF ViT, HF T5): every parameter,
gradient, optimizer state and buffer is in the memory model, and the plans apply and train like the dense model.

* States: at a budget that does not force sharding (schemes=replicate) the predicted model states are
  exactly 16 bytes per parameter plus the buffers; under fsdp, and at a budget equal to the replicated
  model states (which forces sharding: the activations must fit too), they are at least 16 x parameters
  / 8 and below the replicated figure. Every parameter of the model belongs to an op whose rule prices it
  (or to an "opaque" op run whole). Every plan passes `check_applicable` (apply_plan's own code on meta
  tensors). The tight budget of ViT and T5 takes the solver about a minute each: `-m slow`.
* Apply (8 gloo ranks, one forked job per model): loss, every gradient, and every parameter and buffer
  after one SGD step equal the dense model's (per tensor, relative to the tensor's own scale with a floor
  of 1e-3 of the largest gradient or value, so a tensor whose true gradient is zero, like a key bias, is
  not judged on rounding noise), and the collectives equal the prediction (kind, phase, bytes). The fast
  run applies the fsdp plan or the tight-budget plan of the torch models; `-m slow` sweeps every uniform
  scheme each zoo model allows and the tight plan, ViT and T5 included (T5's states are checked there too).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
import zoo
from apply_plans import HARDWARE, mesh_for, uniform_plan
from distributed import run_ranks
from zoo_runs import _check, _dense, _rank

from cost_models.family import prices_params
from cost_models.mesh import Mesh
from planner.api import plan
from planner.apply.applicable import check_applicable
from planner.plans.format import Plan
from planner.trace.graph import ModelGraph
from planner.trace.tracer import capture

MODELS = ("torch-cnn", "torch-lstm-lm", "torch-transformer-encoder", "hf-vit", "hf-t5")
WORLD = 8
FAST = {"torch-cnn": ("fsdp", "tight"), "torch-lstm-lm": ("fsdp", "tight"), "torch-transformer-encoder": ("tight",)}
SLOW_TIGHT = ("hf-vit", "hf-t5")  # about a minute of solver time each at the tight budget
SLOW = ("hf-t5",)  # its capture and plans take half a minute on 2 cores


def _available(name: str) -> Any:
    return pytest.param(name, marks=pytest.mark.skipif(not zoo.ZOO[name].available(), reason="needs transformers"))


@cache
def _captured(name: str) -> tuple[torch.nn.Module, Any, ModelGraph]:
    ex = zoo.build(name)
    return ex.model, ex.example_inputs, capture(ex.model, ex.example_inputs, name=name)


def _plan(graph: ModelGraph, budget: int | str, schemes: list[str] | None = None) -> Plan:
    return plan(graph, budget, world_size=WORLD, schemes=schemes, hardware=HARDWARE, device="cpu",
                meshes=[Mesh((WORLD,))], workers=1)


@cache
def _replicated(name: str) -> Plan:
    return _plan(_captured(name)[2], "1GiB", ["replicate"])


@cache
def _tight(name: str) -> Plan:
    """The plan at a budget equal to the replicated model states: the states must shrink."""
    return _plan(_captured(name)[2], _replicated(name).predicted.model_state_bytes)


def _plans(name: str, schemes: tuple[str, ...]) -> dict[str, Plan]:
    graph = _captured(name)[2]
    return {s: (_tight(name) if s == "tight" else uniform_plan(graph, s)) for s in schemes}


def _states(name: str, tight: bool) -> None:
    model, _, graph = _captured(name)
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    held = {p.name for n in graph.nodes for p in n.params}
    assert held == {n for n, _ in model.named_parameters()}
    assert all(prices_params(n.kind) for n in graph.nodes if n.params)
    rep = _replicated(name)
    assert rep.predicted.model_state_bytes == 16 * params + _planned_buffers(graph, buffers)
    sharded = [_plan(graph, "1GiB", ["fsdp"])] + ([_tight(name)] if tight else [])
    for p in sharded:
        assert p.feasible
        assert 16 * params // WORLD <= p.predicted.model_state_bytes < rep.predicted.model_state_bytes
    for p in [rep] + sharded:
        check_applicable(model, graph, p)


@pytest.mark.parametrize("name", [_available(n) for n in MODELS if n not in SLOW])
def test_every_state_is_counted(name: str) -> None:
    _states(name, tight=name not in SLOW_TIGHT)


@pytest.mark.slow
@pytest.mark.parametrize("name", [_available(n) for n in SLOW_TIGHT])
def test_every_state_is_counted_at_a_tight_budget(name: str) -> None:
    _states(name, tight=True)


def _planned_buffers(graph: ModelGraph, buffers: int) -> int:
    """The buffers held inside ops run whole (BatchNorm's statistics): the CNN's are all there."""
    inside = sum(int(n.attrs.get("buffer_bytes", 0)) for n in graph.nodes if n.kind == "opaque")
    assert inside in (0, buffers)
    return inside


# --- apply ---------------------------------------------------------------------------------------------
def _apply(name: str, schemes: tuple[str, ...]) -> None:
    plans = _plans(name, schemes)
    ref = _dense(name)
    per_rank = run_ranks(_rank, WORLD, timeout_s=900, args=(name, plans, ref))
    for results in per_rank:
        _check(name, results, ref)


pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("name", [_available(n) for n in FAST])
def test_applies_like_dense(name: str) -> None:
    _apply(name, FAST[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", [_available(n) for n in MODELS])
def test_every_uniform_scheme_applies_like_dense(name: str) -> None:
    schemes = tuple(s for s in zoo.ZOO[name].schemes if mesh_for(s).world_size == WORLD) + ("tight",)
    _apply(name, schemes)
