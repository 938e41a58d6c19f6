"""The Llama family's op families: RMSNorm (fused from HF's hand-written form at both capture levels),
scaled_dot_product_attention (heads split, GQA, masks, saved bytes by device measured on this CPU),
cat / expand / complex views following the heads' layout, and `type_as` with two tensor inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cost_models.hardware import load_profile
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, ParamInfo, TensorMeta
from cost_models.strategies import enumerate_strategies, op_cost
from planner.api import plan
from planner.trace.tracer import capture

HW = load_profile("a100-80gb")
MESH = Mesh((2, 2, 2))
F32 = "float32"


def _op(kind: str, in_meta: list[TensorMeta], out: TensorMeta, params=(), **attrs) -> OpNode:
    return OpNode(name="n", kind=kind, target=kind, inputs=[f"i{k}" for k in range(len(in_meta))],
                  input_meta=in_meta, outputs=[out], params=list(params), attrs=attrs)


# --- RMSNorm ------------------------------------------------------------------------------------------
class HandRMSNorm(nn.Module):
    """Meta's reference Llama: x.float() normalised, type_as(x), times the weight."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight


class Net(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm, self.proj = norm, nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


@pytest.mark.parametrize("norm, method", [(HandRMSNorm(16), "fx"), (HandRMSNorm(16), "export"),
                                          (nn.RMSNorm(16), "fx"), (nn.RMSNorm(16), "export")])
def test_rms_norm_in_every_form_is_one_op_with_its_weight(norm: nn.Module, method: str) -> None:
    g = capture(Net(norm), (torch.randn(4, 8, 16),), method=method)
    norms = [n for n in g.nodes if n.kind == "rms_norm"]
    assert len(norms) == 1 and [p.name for p in norms[0].params] == ["norm.weight"]
    assert norms[0].inputs == ["x"] and norms[0].out == TensorMeta((4, 8, 16), F32)
    assert not [n for n in g.nodes if n.kind in ("reduction", "elementwise")]


def test_hf_llama_rms_norm_is_fused_and_the_residual_keeps_its_input() -> None:
    pytest.importorskip("transformers")
    from planner.models.hf_causal import build_hf_llama

    model, inputs = build_hf_llama(num_hidden_layers=1)
    g = capture(model, inputs)
    norms = [n for n in g.nodes if n.kind == "rms_norm"]
    assert [n.params[0].name for n in norms] == ["model.layers.0.input_layernorm.weight",
                                                 "model.layers.0.post_attention_layernorm.weight", "model.norm.weight"]
    assert not [n for n in g.nodes if n.params and n.kind not in ("rms_norm", "linear", "embedding")]


def test_rms_norm_with_split_features_all_reduces_one_float_per_token() -> None:
    x = TensorMeta((8, 32, 64), F32)
    op = _op("rms_norm", [x], x, [ParamInfo("w", (64,), F32, "weight")], normalized_shape=(64,), eps=1e-6)
    lay = Layout(((("x",)), (), ("z",)))
    strategies, _ = enumerate_strategies(op, MESH, [[lay]])
    (s,) = strategies
    cost = op_cost(op, s, MESH, HW)
    tokens = 8 // 2 * 32
    stats = [c for c in cost.collectives if c.tag == "stats"]
    assert [(c.kind, c.axes, c.bytes, c.phase) for c in stats] == [
        ("all_reduce", ("z",), 4 * tokens, "forward"), ("all_reduce", ("z",), 4 * tokens, "backward")]
    grads = [c for c in cost.collectives if c.tag == "grad_weight"]
    assert [(c.axes, c.bytes) for c in grads] == [(("x",), 4 * 64 // 2)]
    assert sum(t.bytes for t in cost.saved) == tokens * 32 * 4 + tokens * 4  # x (H/2 local) + fp32 rstd
    assert s.params == (("weight", Layout((("z",),))),)


# --- scaled_dot_product_attention -----------------------------------------------------------------------
def _sdpa(hq: int, hk: int, mask: TensorMeta | None = None, **attrs) -> OpNode:
    q, k = TensorMeta((8, hq, 32, 16), F32), TensorMeta((8, hk, 32, 16), F32)
    ins = [q, k, k] + ([mask] if mask is not None else [])
    return _op("attention", ins, q, is_causal=True, dropout_p=0.0, scale=None, enable_gqa=hk != hq,
               mask=3 if mask is not None else None, **attrs)


def test_attention_split_by_heads_and_batch_needs_no_communication() -> None:
    op = _sdpa(8, 8, TensorMeta((8, 1, 32, 32), "bool"))
    heads = Layout((("x",), ("y", "z"), (), ()))
    strategies, _ = enumerate_strategies(op, MESH, [[heads], [heads], [heads], [Layout.replicated(4)]])
    s = next(s for s in strategies if s.inputs[0] == heads)
    assert s.inputs[1] == s.inputs[2] == heads and s.outputs[0] == heads
    assert s.inputs[3] == Layout((("x",), (), (), ()))  # the mask: batch split, broadcast over heads
    assert op_cost(op, s, MESH, HW).collectives == ()


def test_grouped_query_heads_split_when_the_kv_heads_divide() -> None:
    heads = Layout(((), ("y", "z"), (), ()))
    ok, _ = enumerate_strategies(_sdpa(8, 4), MESH, [[heads], [heads], [heads]])
    assert any(s.inputs[0] == heads and s.inputs[1] == heads for s in ok)
    three = Layout(((), ("x", "y", "z"), (), ()))
    _, reasons = enumerate_strategies(_sdpa(8, 2), MESH, [[three], [three], [three]])
    assert any("not divisible" in r for r in reasons)


def test_split_head_dim_or_query_length_is_refused() -> None:
    op = _sdpa(8, 8)
    bad = Layout(((), (), ("x",), ("y",)))
    strategies, _ = enumerate_strategies(op, MESH, [[bad], [bad], [bad]])
    assert all(not s.inputs[0].dims[2] and not s.inputs[0].dims[3] for s in strategies)


def test_repeat_kv_of_one_local_kv_head_is_saved_as_a_view() -> None:
    """k, v of 2 KV heads repeated 4 times (hint repeated_kv), heads split 2 ways: each rank holds one KV
    head, the reshape of the expand is a view of it, so k and v keep a quarter of their local size."""
    heads = Layout(((), ("y",), (), ()))

    def saved(**attrs) -> int:
        op = _sdpa(8, 8, **attrs)
        s = next(s for s in enumerate_strategies(op, MESH, [[heads]] * 3)[0] if s.inputs[0] == heads)
        return sum(t.bytes for t in op_cost(op, s, MESH, HW).saved)

    local = 8 * 4 * 32 * 16 * 4  # k's local bytes
    assert saved() - saved(repeated_kv=((1, 4), (2, 4))) == 2 * (local - local // 4)
    assert saved() == saved(repeated_kv=((1, 2), (2, 2)))  # two local KV heads: the reshape copies


def _measured_saved(q, k, v, **kw) -> int:
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.scaled_dot_product_attention(q, k, v, **kw)
    return sum(seen.values())


@pytest.mark.parametrize("hk, mask, dropout", [(8, False, 0.0), (8, True, 0.0), (4, False, 0.0), (8, False, 0.1)])
def test_cpu_saved_bytes_equal_the_measured(hk: int, mask: bool, dropout: float) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 8, 32, 16, requires_grad=True)
    k, v = (torch.randn(2, hk, 32, 16, requires_grad=True) for _ in range(2))
    m = torch.ones(2, 1, 32, 32, dtype=torch.bool).tril() if mask else None
    kw = {"attn_mask": m} if mask else {"is_causal": True}
    measured = _measured_saved(q, k, v, dropout_p=dropout, enable_gqa=hk != 8, **kw)
    metas = [TensorMeta(tuple(t.shape), F32) for t in (q, k, v)] + ([TensorMeta((2, 1, 32, 32), "bool")] if mask else [])
    op = _op("attention", metas, metas[0], is_causal=not mask, dropout_p=dropout, scale=None,
             enable_gqa=hk != 8, mask=3 if mask else None)
    rep = [Layout.replicated(len(m.shape)) for m in metas]
    s = next(s for s in enumerate_strategies(op, Mesh((1,)), [[r] for r in rep])[0] if s.inputs[0] == rep[0])
    assert sum(t.bytes for t in op_cost(op, s, Mesh((1,)), HW, device="cpu").saved) == measured


# --- follow ops: cat, expand, complex views; type_as ------------------------------------------------------
def test_rotate_half_cat_and_repeat_kv_expand_keep_the_heads_split() -> None:
    half = TensorMeta((8, 4, 32, 8), F32)
    heads = Layout((("x",), ("y",), (), ()))
    cat = _op("cat", [half, half], TensorMeta((8, 4, 32, 16), F32), dim=3, stack=False)
    (s,) = [s for s in enumerate_strategies(cat, MESH, [[heads], [heads]])[0] if s.inputs[0] == heads]
    assert s.outputs[0] == heads and op_cost(cat, s, MESH, HW).collectives == ()
    kv = TensorMeta((8, 4, 1, 32, 16), F32)
    exp = _op("expand", [kv], TensorMeta((8, 4, 2, 32, 16), F32), shape=(8, 4, 2, 32, 16))
    lay = Layout((("x",), ("y",), (), (), ()))
    (s,) = enumerate_strategies(exp, MESH, [[lay]])[0]
    assert s.outputs[0] == lay
    real = TensorMeta((8, 32, 4, 8, 2), F32)
    cplx = _op("complex_view", [real], TensorMeta((8, 32, 4, 8), "complex64"), fn="view_as_complex")
    lay = Layout((("x",), (), ("y",), (), ()))
    (s,) = enumerate_strategies(cplx, MESH, [[lay]])[0]
    assert s.outputs[0] == Layout((("x",), (), ("y",), ()))


def test_cat_skips_a_legacy_empty_input() -> None:
    """torch.cat([torch.empty(0), k], dim=2) (HF OPT's empty key cache): the empty input takes any layout."""
    k = TensorMeta((8, 4, 32, 16), F32)
    cat = _op("cat", [TensorMeta((0,), F32), k], k, dim=2, stack=False)
    heads = Layout((("x",), ("y",), (), ()))
    (s,) = [s for s in enumerate_strategies(cat, MESH, [[Layout(((),))], [heads]])[0] if s.outputs[0] == heads]
    assert s.inputs == (None, heads)


class TypeAs(nn.Module):
    """x.type_as(other) with x from a buffer (one layout) and other an activation: two tensor inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("table", torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return self.lin(h * self.table.type_as(h))


def test_type_as_reads_its_second_input_for_the_dtype_only() -> None:
    p = plan(TypeAs(), "1GiB", world_size=8, example_inputs=(torch.randn(8, 4, 16),))
    a = next(a for a in p.assignments if a.target.endswith("type_as"))
    assert a.kind == "contiguous" and len(a.inputs) == 2 and a.inputs[1] is None


def test_an_input_converted_for_several_consumers_is_saved_by_each() -> None:
    """q/k/v projections reading one norm output through a conversion each: the runtime converts once per
    consumer, so each linear saves its own copy (was: counted once, 36 % under the measured bytes)."""
    pytest.importorskip("transformers")
    from apply_plans import mixed_plan

    from planner.models.hf_causal import build_hf_llama

    model, inputs = build_hf_llama(num_hidden_layers=1)
    p = mixed_plan(capture(model, inputs), checkpoint=())  # attention projections 1d_col on 2x2x2
    by_path = {a.module_path: a for a in p.assignments if a.kind == "linear"}
    qkv = [by_path[f"model.layers.0.self_attn.{n}_proj"] for n in "qkv"]
    converted = {r.dst for r in p.redistributions}
    assert all(a.node in converted for a in qkv) and len({a.inputs[0] for a in qkv}) == 1
    assert qkv[0].cost.saved_bytes > 0 and len({a.cost.saved_bytes for a in qkv}) == 1
