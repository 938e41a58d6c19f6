"""Capture: kinds, shapes and attrs against real eager runs; blocks; fingerprints; no real memory; both paths."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from paths import ROOT as REPO_ROOT
from torch.profiler import ProfilerActivity, profile

from planner.models import get_example
from planner.trace.graph import GraphError, ModelGraph
from planner.trace.tracer import CaptureError, capture

ROOT = str(REPO_ROOT)


@pytest.fixture(scope="module")
def tiny() -> tuple:
    ex = get_example("gpt-tiny")
    return ex, capture(ex.model, ex.example_inputs, name="gpt-tiny")


class _Recorder(fx.Interpreter):
    """Runs the traced graph for real and keeps every node's output."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.out: dict[str, object] = {}

    def run_node(self, n: fx.Node) -> object:
        value = super().run_node(n)
        self.out[n.name] = value
        return value


def _metas(value: object) -> list[tuple[tuple[int, ...], str]]:
    items = value if isinstance(value, (tuple, list)) else [value]
    return [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in items]


def test_gpt_tiny_shapes_equal_a_real_run(tiny: tuple) -> None:
    ex, g = tiny
    assert g.method == "fx" and g.gm is not None
    rec = _Recorder(g.gm)
    loss = rec.run(*ex.example_inputs)
    torch.testing.assert_close(loss, ex.model(*ex.example_inputs))  # the traced graph is the model
    for n in g.nodes:
        if n.kind != "output":
            assert [(m.shape, m.dtype) for m in n.outputs] == _metas(rec.out[n.name]), n.name
        for src, meta in zip(n.inputs, n.input_meta):
            assert (meta.shape, meta.dtype) in [(o.shape, o.dtype) for o in g.node(src).outputs], (n.name, src)
    # every FX node holding a tensor is an op, every op is an FX node (1:1 names for the rewrite)
    tensor_nodes = {k for k, v in rec.out.items() if isinstance(v, torch.Tensor)
                    or (isinstance(v, tuple) and v and all(isinstance(x, torch.Tensor) for x in v))}
    params = {k for k in tensor_nodes if isinstance(rec.out[k], nn.Parameter)}
    assert {n.name for n in g.nodes} == tensor_nodes - params


def test_gpt_tiny_leaf_layers_equal_eager_hooks(tiny: tuple) -> None:
    ex, g = tiny
    kinds = {nn.Linear: "linear", nn.Embedding: "embedding", nn.LayerNorm: "layer_norm", nn.Dropout: "dropout",
             nn.GELU: "activation"}
    seen: list[tuple[str, str, tuple[int, ...]]] = []
    hooks = [m.register_forward_hook(lambda mod, i, o, name=name: seen.append((name, kinds[type(mod)],
                                                                                 tuple(o.shape))))
             for name, m in ex.model.named_modules() if type(m) in kinds]
    try:
        ex.model(*ex.example_inputs)
    finally:
        for h in hooks:
            h.remove()
    captured = [(n.module_path, n.kind, n.out.shape) for n in g.nodes if n.target.startswith("nn.")]
    assert captured == seen


def test_gpt_tiny_kinds_and_attrs(tiny: tuple) -> None:
    _, g = tiny
    counts = Counter(n.kind for n in g.nodes if n.block == "transformer.h.0")
    assert {k: counts[k] for k in ("linear", "layer_norm", "matmul", "softmax", "dropout", "activation", "split")} \
        == {"linear": 4, "layer_norm": 2, "matmul": 2, "softmax": 1, "dropout": 3, "activation": 1, "split": 1}
    by_path = {n.module_path: n for n in g.nodes if n.target.startswith("nn.")}
    c_attn = by_path["transformer.h.0.attn.c_attn"]
    assert c_attn.attrs == {"in_features": 64, "out_features": 192, "has_bias": True, "weight_transposed": False}
    assert [(p.name, p.shape, p.role) for p in c_attn.params] == [
        ("transformer.h.0.attn.c_attn.weight", (192, 64), "weight"), ("transformer.h.0.attn.c_attn.bias", (192,), "bias")]
    assert by_path["lm_head"].attrs["has_bias"] is False
    assert by_path["transformer.wte"].attrs == {"num_embeddings": 128, "embedding_dim": 64, "padding_idx": None}
    assert by_path["transformer.h.0.ln_1"].attrs == {"normalized_shape": (64,), "eps": 1e-5, "elementwise_affine": True}
    assert by_path["transformer.h.0.mlp.gelu"].attrs == {"fn": "gelu", "approximate": "none"}
    split = g.consumers(c_attn.name)[0]
    assert split.kind == "split" and split.attrs == {"dim": 2, "sizes": (64, 64, 64)} and len(split.outputs) == 3
    assert [c.attrs["index"] for c in g.consumers(split.name)] == [0, 1, 2]
    matmuls = [n for n in g.nodes if n.kind == "matmul" and n.block == "transformer.h.0"]
    assert [m.attrs["transpose_b"] for m in matmuls] == [True, False]  # q @ k^T, att @ v
    assert g.node(matmuls[0].inputs[1]).attrs == {"dims": (0, 1, 3, 2)}
    scale = g.consumers(matmuls[0].name)[0]
    assert scale.attrs == {"fn": "mul", "saves": (), "saves_output": False, "scalar": (0.25,)}
    masked = g.consumers(scale.name)[0]
    assert masked.attrs["fn"] == "masked_fill" and masked.attrs["saves"] == (1,)
    assert g.consumers(masked.name)[0].attrs == {"dim": 3, "log": False}
    for n in g.nodes:
        if n.kind == "reshape":
            assert n.attrs["shape"] == n.out.shape
    ce = [n for n in g.nodes if n.kind == "cross_entropy"]
    assert len(ce) == 1 and ce[0].attrs == {"fn": "cross_entropy", "ignore_index": -1, "reduction": "mean"}
    assert g.nodes[-1].kind == "output" and g.nodes[-1].inputs == [ce[0].name]


def test_gpt_tiny_blocks(tiny: tuple) -> None:
    _, g = tiny
    assert [b.name for b in g.blocks] == ["transformer.h.0", "transformer.h.1"]
    assert g.blocks[0].cls == g.blocks[1].cls
    for n in g.nodes:
        inside = n.module_path.startswith("transformer.h.")
        assert n.block == (".".join(n.module_path.split(".")[:3]) if inside else None), n.name
    residual = [g.node(x) for x in g.blocks[0].nodes if g.node(x).module_path == "transformer.h.0"]
    assert [n.attrs["fn"] for n in residual] == ["add", "add"]  # functional ops of Block.forward itself
    assert sum(len(b.nodes) for b in g.blocks) == sum(n.block is not None for n in g.nodes)


def test_graph_edges_and_lookups(tiny: tuple) -> None:
    _, g = tiny
    assert len(g) == len(g.nodes) == g.graph.number_of_nodes()
    for n in g.nodes:
        for i, src in enumerate(n.inputs):
            assert g.graph.edges[src, n.name]["arg"] == n.inputs.index(src) <= i
    add = g.node("add")
    assert [p.name for p in g.producers("add")] == ["transformer_wte", "transformer_wpe"]
    assert [c.name for c in g.consumers(add.name)] == ["transformer_drop"]
    with pytest.raises(GraphError, match="no op named"):
        g.node("nope")
    text = g.summary()
    assert "linear 9" in text and "2 (transformer.h.0" in text and f"{g.param_numel():,} parameters" in text
    assert g.param_numel() == sum(p.numel() for p in get_example("gpt-tiny").model.parameters())


def test_fingerprint_stable_and_shape_sensitive(tiny: tuple) -> None:
    ex, g = tiny
    again = capture(ex.model, ex.example_inputs)
    assert again.fingerprint == g.fingerprint and len(g.fingerprint) == 64
    meta = get_example("gpt-tiny", device="meta")
    assert capture(meta.model, meta.example_inputs).fingerprint == g.fingerprint
    other = get_example("gpt-tiny", device="meta", batch_size=4)
    assert capture(other.model, other.example_inputs).fingerprint != g.fingerprint
    code = ("from planner.trace.tracer import capture; from planner.models import get_example; "
            "ex = get_example('gpt-tiny', device='meta'); print(capture(ex.model, ex.example_inputs).fingerprint)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == g.fingerprint


def test_serialisation_round_trip(tiny: tuple) -> None:
    _, g = tiny
    data = json.loads(json.dumps(g.to_dict()))
    back = ModelGraph.from_dict(data)
    assert back.nodes == g.nodes and back.blocks == g.blocks and back.fingerprint == g.fingerprint
    assert back.gm is None
    data["nodes"][5]["outputs"][0]["shape"][0] += 1
    with pytest.raises(GraphError, match="does not match its fingerprint"):
        ModelGraph.from_dict(data)


def _largest_cpu_allocation(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events()), default=0)


def test_capture_allocates_no_parameter_memory() -> None:
    # gpt2-xl's hidden size on the meta device: every weight is >= 1600 * 1600 * 4 bytes if materialised.
    big = get_example("gpt2-xl", n_layer=2, seq_len=128, batch_size=2)
    assert _largest_cpu_allocation(lambda: capture(big.model, big.example_inputs)) < 64 * 1024
    assert all(p.device.type == "meta" for p in big.model.parameters())
    # A real model is captured on fake tensors; the same measurement sees its real forward allocate.
    real = get_example("gpt-tiny", n_embd=256, n_head=4, vocab_size=2048)
    capture(real.model, real.example_inputs)  # warm-up: lazy imports allocate
    threshold = 256 * 1024 * 4  # the c_fc weight
    assert _largest_cpu_allocation(lambda: capture(real.model, real.example_inputs)) < 64 * 1024
    assert _largest_cpu_allocation(lambda: real.model(*real.example_inputs)) >= threshold
    assert all(p.device.type == "cpu" for p in real.model.parameters())


def test_logits_only_when_targets_left_out() -> None:
    ex = get_example("gpt-tiny", device="meta")
    g = capture(ex.model, ex.example_inputs[:1])
    assert "cross_entropy" not in {n.kind for n in g.nodes}
    assert [n.name for n in g.nodes if n.kind == "input"] == ["idx"]
    assert g.nodes[-1].input_meta[0].shape == (8, 16, 128)


def test_input_shapes() -> None:
    ex = get_example("gpt-tiny", device="meta")
    ref = capture(ex.model, ex.example_inputs).fingerprint
    assert capture(ex.model, input_shapes=[(8, 16), (8, 16)]).fingerprint == ref  # ids default to int64
    assert capture(ex.model, input_shapes=[((8, 16), "int64"), ((8, 16), torch.int64)]).fingerprint == ref
    assert capture(ex.model, input_shapes={"idx": (8, 16), "targets": (8, 16)}).fingerprint == ref
    mlp = get_example("mlp")
    g = capture(mlp.model, input_shapes=[(32, 64), ((32,), torch.int64)])
    assert g.node("x").out.dtype == "float32" and g.node("targets").out.dtype == "int64"
    with pytest.raises(CaptureError, match="not both"):
        capture(ex.model, ex.example_inputs, input_shapes=[(8, 16)])
    with pytest.raises(CaptureError, match="needs example_inputs"):
        capture(ex.model)
    with pytest.raises(CaptureError, match="bad input_shapes entry"):
        capture(ex.model, input_shapes=[("8", 16)])
    with pytest.raises(CaptureError, match="unknown dtype"):
        capture(ex.model, input_shapes=[((8, 16), "int65")])


class _Functional(nn.Module):
    """Parameters used through get_attr: F.linear, x @ W (W stored [in, out]) and x @ W.t()."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(8, 4))   # [out, in]
        self.b1 = nn.Parameter(torch.zeros(8))
        self.w2 = nn.Parameter(torch.randn(8, 6))   # [in, out]
        self.w3 = nn.Parameter(torch.randn(6, 6))   # [out, in], square: transposed by .t()
        self.scale = nn.Parameter(torch.ones(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(F.linear(x, self.w1, self.b1))
        h = h @ self.w2
        h = torch.matmul(h, self.w3.t()) * self.scale
        return F.log_softmax(h, dim=-1).sum(dim=(0,), keepdim=True)


def test_functional_parameters_and_views() -> None:
    g = capture(_Functional(), (torch.randn(3, 4),))
    lin = [n for n in g.nodes if n.kind == "linear"]
    assert [(n.target, [p.name for p in n.params], n.attrs["weight_transposed"]) for n in lin] == [
        ("F.linear", ["w1", "b1"], False), ("operator.matmul", ["w2"], True), ("torch.matmul", ["w3"], False)]
    assert [n.attrs["out_features"] for n in lin] == [8, 6, 6]
    # x * param: the element-wise rule prices no parameter, so the op runs whole ("opaque"), batch-split
    mul = next(n for n in g.nodes if n.params and n.params[0].name == "scale")
    assert mul.kind == "opaque" and mul.attrs["batch_dims"] == (0,) and mul.attrs["out_batch_dims"] == (0,)
    assert next(n for n in g.nodes if n.kind == "softmax").attrs == {"dim": 1, "log": True}
    red = next(n for n in g.nodes if n.kind == "reduction")
    assert red.attrs == {"fn": "sum", "dims": (0,), "keepdim": True} and red.out.shape == (1, 6)
    assert not [n for n in g.nodes if n.kind == "other"]


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


def test_tied_weights_share_one_name() -> None:
    g = capture(_Tied(), (torch.zeros(2, 3, dtype=torch.long),))
    assert g.shared_params() == {"emb.weight": ["emb", "head"]}
    assert g.param_numel() == 16 * 8


def test_hf_conv1d_is_a_transposed_linear_under_fx() -> None:
    from transformers.pytorch_utils import Conv1D

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = Conv1D(12, 4)  # nf=12 outputs, nx=4 inputs, weight [4, 12]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x)

    g = capture(Net(), (torch.randn(2, 5, 4),))
    (lin,) = [n for n in g.nodes if n.kind == "linear"]
    assert g.method == "fx" and lin.target.endswith("Conv1D")
    assert lin.attrs == {"in_features": 4, "out_features": 12, "has_bias": True, "weight_transposed": True}
    assert [(p.name, p.shape) for p in lin.params] == [("proj.weight", (4, 12)), ("proj.bias", (12,))]


def test_errors_are_located_in_model_code_not_in_capture_or_the_cost_model() -> None:
    """`where()` skips capture's own frames (planner/trace/, the classifiers in cost_models/) and names the
    user's model code."""
    import cost_models.strategies.norm as norm_family
    import planner.models.gpt as gpt_model
    import planner.trace.patterns as patterns
    from planner.trace.common import _is_model_code

    assert not _is_model_code(patterns.__file__) and not _is_model_code(norm_family.__file__)
    assert _is_model_code(gpt_model.__file__)
