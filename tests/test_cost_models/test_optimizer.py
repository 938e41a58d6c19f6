"""The optimizer implementations the planner prices (`cost_models.optimizer`): torch's defaults, the AdamW
arguments that select each, the per-op and per-step rules, and a clear error for a name it does not know.
What each implementation holds is measured in tests/test_planner/verify/test_peak_memory.py."""

from __future__ import annotations

import pytest
import torch

from cost_models.mesh import Mesh
from cost_models.optimizer import (
    OptimizerError,
    default_optimizer,
    op_optimizer_bytes,
    optimizer_kwargs,
    optimizer_step_bytes,
    resolve_optimizer,
    step_optimizer_bytes,
)
from planner.api import plan
from planner.models.loading import get_example


def test_defaults_are_torchs() -> None:
    assert default_optimizer("cuda") == resolve_optimizer(None, "cuda") == "foreach"
    assert default_optimizer("cpu") == resolve_optimizer(None, "cpu") == "single_tensor"
    # what torch itself picks for CPU parameters (foreach needs CUDA-like devices; fused is never the default)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))])
    assert not opt.defaults["foreach"] and not opt.defaults["fused"]
    assert optimizer_kwargs("foreach") == {"foreach": True} and optimizer_kwargs(None) == {}


def test_step_rules() -> None:
    per_op = [op_optimizer_bytes("single_tensor", n, k, 16) for n, k in ((100, 60), (50, 50))]
    assert per_op == [480, 400] and step_optimizer_bytes("single_tensor", per_op) == 480  # the largest, 2 x 60 x 4
    per_op = [op_optimizer_bytes("foreach", n, k, 18) for n, k in ((100, 60), (50, 50))]
    assert step_optimizer_bytes("foreach", per_op) == 600  # every parameter, 4 bytes an element
    assert op_optimizer_bytes("fused", 100, 60, 16) == 0
    # beside them, the caller's batch: whole with inputs "full", its block with "sharded"
    mesh = Mesh((2, 4))
    assert optimizer_step_bytes("foreach", [600], [((8, 16), 4)], "full", mesh) == 600 + 512
    assert optimizer_step_bytes("foreach", [600], [((8, 16), 4)], "sharded", mesh) == 600 + 64
    assert optimizer_step_bytes(None, [600], [((8, 16), 4)], "full", mesh) == 0  # a plan from before


def test_unknown_implementation_is_a_clear_error() -> None:
    ex = get_example("mlp")
    with pytest.raises(OptimizerError, match="unknown optimizer implementation 'adam'; use one of single_tensor"):
        plan(ex.model, "1GiB", world_size=8, example_inputs=ex.example_inputs, optimizer="adam")
    with pytest.raises(OptimizerError, match="unknown optimizer implementation"):
        optimizer_kwargs("sgd")
