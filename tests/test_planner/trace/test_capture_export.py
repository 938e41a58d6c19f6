"""The torch.export path: HF GPT-2, agreement with the FX path, fallback, and the error when both fail."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from planner.models import get_example
from planner.trace.tracer import CaptureError, capture

_HEAVY = ("linear", "embedding", "layer_norm", "matmul", "softmax", "dropout", "activation", "split",
          "cross_entropy")


@pytest.fixture(scope="module")
def hf() -> tuple:
    ex = get_example("hf-gpt2")
    return ex, capture(ex.model, ex.example_inputs, name="hf-gpt2")


def test_hf_gpt2_linears_and_blocks(hf: tuple) -> None:
    ex, g = hf
    assert g.method == "export" and g.program is not None
    cfg = ex.model.config
    h = cfg.n_embd
    for i in range(cfg.n_layer):
        lin = [n for n in g.nodes if n.kind == "linear" and n.block == f"transformer.h.{i}"]
        prefix = f"transformer.h.{i}."
        assert [n.module_path for n in lin] == [prefix + p for p in ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                                     "mlp.c_proj")]
        assert [[p.name for p in n.params] for n in lin] == [
            [prefix + p + ".weight", prefix + p + ".bias"] for p in ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                                     "mlp.c_proj")]
        assert [(n.attrs["in_features"], n.attrs["out_features"]) for n in lin] == [(h, 3 * h), (h, h), (h, 4 * h),
                                                                                  (4 * h, h)]
        assert all(n.attrs["weight_transposed"] and n.attrs["has_bias"] and n.target == "aten.addmm" for n in lin)
        assert all(n.params[0].shape == (n.attrs["in_features"], n.attrs["out_features"]) for n in lin)
        # Conv1D is view -> addmm -> view: the views stay as reshapes around the linear
        assert all(g.node(n.inputs[0]).kind == "reshape" for n in lin)
        assert all([c.kind for c in g.consumers(n.name)] == ["reshape"] for n in lin)
    assert [b.name for b in g.blocks] == ["transformer.h.0", "transformer.h.1"]
    assert g.blocks[0].cls == g.blocks[1].cls
    head = next(n for n in g.nodes if n.module_path == "lm_head")
    assert head.kind == "linear" and head.attrs["has_bias"] is False
    assert g.shared_params() == {"transformer.wte.weight": ["embedding", head.name]}  # tied head


def test_hf_gpt2_outputs_equal_a_real_run(hf: tuple) -> None:
    ex, g = hf
    ex.model.eval()  # no dropout: two runs give the same numbers
    try:
        out = ex.model(**ex.example_inputs, use_cache=False)
    finally:
        ex.model.train()
    final = g.nodes[-1]
    assert final.kind == "output"
    assert [m.shape for m in final.input_meta] == [tuple(out.loss.shape), tuple(out.logits.shape)]
    # every op's shape equals the exported program run for real
    seen: dict[str, tuple] = {}

    class Rec(fx.Interpreter):
        def run_node(self, n: fx.Node) -> object:
            v = super().run_node(n)
            if isinstance(v, torch.Tensor):
                seen[n.name] = (tuple(v.shape), str(v.dtype).removeprefix("torch."))
            return v

    module = g.program.module()
    Rec(module).run(*[ex.example_inputs[k] for k in ("input_ids", "labels")], False)
    checked = 0
    for n in g.nodes:
        if n.name in seen and len(n.outputs) == 1 and n.kind != "output":
            assert seen[n.name] == (n.out.shape, n.out.dtype), n.name
            checked += 1
    assert checked > 0.9 * len([n for n in g.nodes if len(n.outputs) == 1 and n.kind not in ("output", "input")])


def test_export_path_agrees_with_fx_on_gpt_tiny() -> None:
    ex = get_example("gpt-tiny", device="meta")
    fx_graph = capture(ex.model, ex.example_inputs, method="fx")
    ex_graph = capture(ex.model, ex.example_inputs, method="export")
    assert (fx_graph.method, ex_graph.method) == ("fx", "export")

    def heavy(g):
        return [(n.kind, n.attrs, [p.name for p in n.params], n.outputs, n.module_path, n.block)
                for n in g.nodes if n.kind in _HEAVY]

    assert heavy(ex_graph) == heavy(fx_graph)
    assert [b.name for b in ex_graph.blocks] == [b.name for b in fx_graph.blocks]
    assert ex_graph.blocks[0].cls == ex_graph.blocks[1].cls
    assert ex_graph.param_numel() == fx_graph.param_numel()


class _ShapeBranch(nn.Module):
    """Python control flow on a shape: FX cannot trace it, export specialises it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:
            return self.fc(x).relu()
        return self.fc(x)


def test_falls_back_to_export_when_fx_fails() -> None:
    with pytest.raises(Exception, match="control flow"):
        fx.symbolic_trace(_ShapeBranch())
    g = capture(_ShapeBranch(), (torch.randn(3, 4),))
    assert g.method == "export"
    assert [n.kind for n in g.nodes] == ["input", "linear", "activation", "output"]
    with pytest.raises(CaptureError, match=r"fx: TraceError") as info:
        capture(_ShapeBranch(), (torch.randn(3, 4),), method="fx")
    assert "(fx failed)" in str(info.value) and "\n  export:" not in str(info.value)


class _ValueBranch(nn.Module):
    """Python control flow on a tensor value: neither path can capture it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.sum() > 0:
            return y * 2
        return y


def test_untraceable_model_names_both_failures() -> None:
    model, x = _ValueBranch(), torch.randn(3, 4)
    with pytest.raises(Exception, match="control flow"):
        fx.symbolic_trace(model)
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(model, (x,))
    with pytest.raises(CaptureError) as info:
        capture(model, (x,))
    msg = str(info.value)
    assert "fx and export failed" in msg
    assert "fx: TraceError: symbolically traced variables cannot be used as inputs to control flow" in msg
    assert "export: GuardOnDataDependentSymNode: Could not guard on data-dependent expression" in msg
    assert msg.count("test_capture_export.py") == 2 and msg.count("if y.sum() > 0:") == 2
    assert "How to fix" in msg
    assert isinstance(info.value, ValueError)


class _Nonzero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[torch.nonzero(x > 0)[:, 0]].sum()


def test_data_dependent_shape_names_the_op() -> None:
    with pytest.raises(CaptureError) as info:
        capture(_Nonzero(), (torch.randn(5, 2),))
    msg = str(info.value)
    assert "op nonzero (torch.nonzero)" in msg and "op nonzero (aten.nonzero.default)" in msg
    assert "depends on tensor values" in msg and msg.count("torch.nonzero(x > 0)") == 2


def test_bad_arguments() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(CaptureError, match="unknown capture method"):
        capture(model, (torch.randn(1, 2),), method="jit")
    with pytest.raises(CaptureError, match="must be a tensor, a tuple"):
        capture(model, "x")
    with pytest.raises(CaptureError, match="needs an nn.Module"):
        capture(lambda x: x, (torch.randn(1, 2),))  # type: ignore[arg-type]
