"""Single-process parts of apply and verify: saved-activation measurement, value folding, checkpoint-region
extraction, errors and the report."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils.checkpoint as tuc

from planner.apply.blocks import extract_blocks
from planner.apply.graph import BLOCK_KEY
from planner.apply.values import ApplyError, is_foldable, node_values
from planner.models.gpt import build_gpt
from planner.trace.tracer import capture
from planner.verify.measure import SavedActivationMeter, note_kept
from planner.verify.report import ErrorRow, VerifyReport, format_report, rel_error


# --- SavedActivationMeter ----------------------------------------------------------------------------
def test_an_input_read_by_three_linears_counts_once_and_weights_not_at_all() -> None:
    q, k, v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    meter = SavedActivationMeter([p for m in (q, k, v) for p in m.parameters()])
    with meter:
        (q(x) + k(x) + v(x)).sum()
    assert meter.bytes == 4 * 8 * 4  # x once; the weights (saved as views) are model state
    assert meter.tensors == 3


def test_a_view_counts_only_the_bytes_it_spans() -> None:
    big = torch.randn(10, 6)
    w = torch.randn(2, 6, requires_grad=True)
    with SavedActivationMeter([w]) as meter:
        (big[2:4] * w).sum()  # mul saves the view of rows 2-3, not the whole storage
    assert meter.bytes == 2 * 6 * 4


def test_dropout_and_gelu_saves() -> None:
    x = torch.randn(16, 32, requires_grad=True)
    with SavedActivationMeter() as meter:
        torch.nn.functional.gelu(x)
    assert meter.bytes == x.numel() * 4
    with SavedActivationMeter() as meter:
        torch.nn.functional.dropout(x, 0.0, True)  # p = 0 is the identity: nothing saved
    assert meter.bytes == 0


def test_checkpoint_saves_nothing_outside_but_its_kept_inputs_are_noted() -> None:
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)

    def body(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(lin(t))

    with SavedActivationMeter(list(lin.parameters())) as meter:
        note_kept([x])
        tuc.checkpoint(body, x, use_reentrant=False)
    assert meter.bytes == x.numel() * 4
    note_kept([x])  # no meter active: nothing happens


def test_by_dtype() -> None:
    x = torch.randn(3, 5, requires_grad=True)
    ids = torch.randint(0, 10, (7,))
    emb = nn.Embedding(10, 4)
    with SavedActivationMeter(list(emb.parameters())) as meter:
        torch.nn.functional.gelu(x)
        emb(ids)
    assert meter.by_dtype == {"float32": 60, "int64": 56}


# --- value folding -----------------------------------------------------------------------------------
def test_shape_computations_fold_to_global_values_and_devices_stay_dynamic() -> None:
    model, inputs = build_gpt("gpt-tiny", seed=0)
    graph = capture(model, inputs)
    nv = node_values(graph, model)
    assert nv.folded["getitem_1"] == 16 and nv.folded["getitem_4"] == 64 and nv.folded["floordiv"] == 16
    assert nv.folded["size"] == torch.Size([8, 16])
    devices = [n.name for n in graph.gm.graph.nodes if n.op == "call_function" and n.target is getattr]
    assert devices and not any(d in nv.folded for d in devices)
    assert not nv.params  # every parameter sits inside a leaf module


def test_is_foldable() -> None:
    assert is_foldable((8, 16, slice(None, 4), None, torch.float32))
    assert not is_foldable(torch.device("cpu"))
    assert not is_foldable((torch.zeros(1),))


# --- checkpoint regions ------------------------------------------------------------------------------
def _graph(tags: dict[str, str]) -> fx.Graph:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,), name="a")
    b = g.call_function(torch.neg, (a,), name="b")
    c = g.call_function(torch.add, (b, a), name="c")
    d = g.call_function(torch.neg, (c,), name="d")
    g.output((d, b))
    for n in g.nodes:
        if n.name in tags:
            n.meta[BLOCK_KEY] = tags[n.name]
    return g


def test_a_tagged_region_becomes_one_checkpointed_call() -> None:
    g = _graph({"b": "blk", "c": "blk"})
    new, blocks = extract_blocks(g, lambda b: f"ckpt_{b}")
    assert list(blocks) == ["ckpt_blk"]
    calls = [n for n in new.nodes if n.op == "call_module"]
    assert len(calls) == 1 and [a.name for a in calls[0].args] == ["a"]
    root = nn.Module()
    root.add_module("ckpt_blk", blocks["ckpt_blk"])
    blocks["ckpt_blk"].bind(root)
    gm = fx.GraphModule(root, new)
    x = torch.randn(5, requires_grad=True)
    d, b = gm(x)
    a = torch.relu(x)
    assert torch.equal(d, -(-a + a)) and torch.equal(b, -a)
    d.sum().backward()
    assert x.grad is not None


def test_a_region_that_is_not_contiguous_is_refused() -> None:
    g = _graph({"a": "blk", "c": "blk"})  # b reads a (in the block) and feeds c (in the block)
    with pytest.raises(ApplyError, match="not contiguous"):
        extract_blocks(g, lambda b: f"ckpt_{b}")


# --- errors and report -------------------------------------------------------------------------------
def test_rel_error() -> None:
    want = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
    assert rel_error(want + torch.tensor([0.0, 0.0, 4e-6], dtype=torch.float64), want) == pytest.approx(1e-6)
    assert rel_error(torch.tensor([1e-7]), torch.zeros(1)) == pytest.approx(1e-7)
    assert rel_error(torch.tensor([2e-4]), torch.tensor([1e-4]), floor=10.0) == pytest.approx(1e-5)
    assert rel_error(torch.zeros(2), torch.zeros(3)) == float("inf")


def test_report_passes_only_when_everything_holds() -> None:
    r = VerifyReport("m", "p.json", 2, "2(x)", 1e-5, 0.05, predicted_act=1000)
    r.errors = [ErrorRow("loss", 1e-7), ErrorRow("gradients", 2e-6, "w")]
    r.measured_comm = Counter({("all_reduce", "backward"): 64})
    r.predicted_comm = Counter({("all_reduce", "backward"): 64})
    r.plan_comm_total = 64
    r.measured_act = [990, 1020]
    text = format_report(r)
    assert r.ok and text.rstrip().endswith("PASS") and "FAIL" not in text
    r.measured_act = [990, 1100]
    assert not r.ok and format_report(r).rstrip().endswith("FAIL: activations")
    r.measured_act = [1000, 1000]
    r.measured_comm[("all_gather", "forward")] = 8
    assert not r.comm_ok() and "FAIL: communication" in format_report(r)
    del r.measured_comm[("all_gather", "forward")]
    # a peak over the prediction names where each failing rank reached it
    r.predicted_peak, r.measured_peak = 1000, [1050, 1200]
    r.peak_at = ["in the backward, after aten.mm.default", "in the optimizer step, after aten.div.Tensor"]
    text = format_report(r)
    assert not r.ok and text.rstrip().endswith("FAIL: peak memory")
    assert "rank 1: in the optimizer step, after aten.div.Tensor" in text and "aten.mm.default" not in text
