"""Convolutions (cost_models/strategies/conv.py): the whole-op strategies plus output channels split
(`1d_col`), priced exactly and run exactly.

* Conv2d(16 -> 32, 3x3) on a (2, 4) mesh, 1d_col over y: weight and bias split on the output channels, the
  output's channel dim split over y and its batch over x, the input gradient all-reduced over y (unless the
  input carries no gradient), the parameter gradients over x.
* Grouped convolutions keep only the whole-op strategies, and say why.
* The zoo CNN with both convolutions 1d_col, on 8 ranks and on 2x2x2: loss, per-tensor gradients,
  parameters and buffers after an SGD step equal the dense model's; collectives equal the prediction.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import zoo
from apply_plans import mixed_plan
from distributed import run_ranks
from zoo_runs import _check, _dense, _rank

from cost_models.hardware import load_profile
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.strategies import enumerate_strategies, mark_graph_hints, op_cost
from planner.apply.applicable import check_applicable
from planner.trace.tracer import capture


class _Two(nn.Module):
    def __init__(self, groups: int = 1) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.relu(self.c1(x))).sum()


def _convs(groups: int = 1):
    g = capture(_Two(groups), (torch.randn(8, 3, 6, 6),))
    mark_graph_hints(g.nodes)
    return {n.name: n for n in g.nodes if n.kind == "conv"}


def test_output_channels_split_priced_exactly() -> None:
    convs = _convs()
    assert {n.attrs["groups"] for n in convs.values()} == {1}
    mesh = Mesh((2, 4), ("x", "y"))
    hw = load_profile("a100-80gb")
    found, _ = enumerate_strategies(convs["c2"], mesh)
    s = next(s for s in found if s.scheme == "1d_col" and s.option("T") == ("y",))
    assert s.option("dp") == ("x",)
    assert s.inputs[0] == Layout.shard(4, 0, ("x",)) and s.outputs[0] == Layout((("x",), ("y",), (), ()))
    assert dict(s.params) == {"weight": Layout.shard(4, 0, ("y",)), "bias": Layout.shard(1, 0, ("y",))}
    cost = op_cost(convs["c2"], s, mesh, hw)
    assert cost.param_elems == (32 * 16 * 9 + 32) // 4
    x_local = 8 // 2 * 16 * 6 * 6 * 4
    assert sorted((c.kind, c.axes, c.bytes, c.tag) for c in cost.collectives) == sorted([
        ("all_reduce", ("x",), 32 * 16 * 9 // 4 * 4, "grad_weight"), ("all_reduce", ("x",), 32 // 4 * 4, "grad_weight"),
        ("all_reduce", ("y",), x_local, "grad_input")])
    assert cost.saved_bytes == x_local
    # the first conv reads the graph input, which carries no gradient: no input all-reduce
    first = next(s for s in enumerate_strategies(convs["c1"], mesh)[0] if s.scheme == "1d_col")
    assert not [c for c in op_cost(convs["c1"], first, mesh, hw).collectives if c.tag == "grad_input"]


def test_grouped_convolution_runs_whole() -> None:
    c2 = _convs(groups=4)["c2"]
    found, reasons = enumerate_strategies(c2, Mesh((8,)))
    assert {s.scheme for s in found} == {"replicate", "fsdp"}
    assert any("grouped convolution" in r for r in reasons)


def _channels(name: str, path: str, kind: str, s) -> bool:
    return kind != "conv" or s.scheme == "1d_col"


@pytest.mark.distributed
def test_cnn_with_channels_split_matches_dense() -> None:
    ex = zoo.build("torch-cnn")
    g = capture(ex.model, ex.example_inputs)
    plans = {f"1d_col {m}": mixed_plan(g, checkpoint=(), rule=_channels, mesh=m) for m in (Mesh((8,)), Mesh((2, 2, 2)))}
    for p in plans.values():
        check_applicable(ex.model, g, p)
        assert [a.scheme for a in p.assignments if a.kind == "conv"] == ["1d_col", "1d_col"]
    ref = _dense("torch-cnn")
    for results in run_ranks(_rank, 8, timeout_s=300, args=("torch-cnn", plans, ref)):
        _check("torch-cnn", results, ref)
