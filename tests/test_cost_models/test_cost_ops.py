"""Strategies of the non-linear op families: shape ops, matmul, element-wise, layer norm, embedding,
cross-entropy, dropout, `other`."""

from __future__ import annotations

import pytest

from cost_models.hardware import load_profile
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, ParamInfo, TensorMeta
from cost_models.strategies import enumerate_strategies, op_cost
from cost_models.strategies.views import reshape_layout

HW = load_profile("a100-80gb")
MESH = Mesh((2, 4))
f32 = lambda *shape: TensorMeta(tuple(shape), "float32")  # noqa: E731
L = lambda *dims, **kw: Layout(tuple(tuple(d) for d in dims), **kw)  # noqa: E731


def op(kind, inputs, in_meta, outs, params=(), name="n", **attrs):
    return OpNode(name, kind, kind, list(inputs), list(in_meta), list(outs), list(params), attrs=attrs)


@pytest.mark.parametrize("src, dst, lay, want", [
    ((8, 16, 64), (8, 16, 4, 16), L("x", "", "y"), L("x", "", "y", "")),            # heads split over y
    ((8, 16, 4, 16), (8, 16, 64), L("", "", "y", ""), L("", "", "y")),               # back to hidden
    ((8, 16, 128), (128, 128), L("x", "", "y"), L("x", "y")),                        # merge tokens: outer split kept
    ((2, 16, 64), (32, 64), L("x", "y", ""), L("xy", "")),                           # batch fully split: seq may follow
])
def test_reshape_keeps_outermost_splits(src, dst, lay, want):
    assert reshape_layout(src, dst, lay, MESH) == want


def test_reshape_refuses_inner_splits():
    got = reshape_layout((8, 16, 64), (128, 64), L("x", "y", ""), MESH)
    assert isinstance(got, str) and "not outermost" in got
    got = reshape_layout((8, 16, 64), (8, 16, 2, 32), L("", "", "y", interleave=3), MESH)
    assert isinstance(got, str)


def test_split_of_an_interleaved_output_keeps_the_split():
    sp = op("split", ["c"], [f32(8, 16, 192)], [f32(8, 16, 64)] * 3, dim=2, sizes=(64, 64, 64))
    strategies, reasons = enumerate_strategies(sp, MESH, [[L("x", "", "y", interleave=3), L("x", "", "y")]])
    assert [s.outputs for s in strategies] == [(L("x", "", "y"),) * 3]
    assert any("interleave 1" in r for r in reasons)


def test_attention_matmul_is_local_per_head_group_and_gathers_split_keys():
    q, kt = f32(8, 4, 16, 16), f32(8, 4, 16, 16)
    mm = op("matmul", ["q", "kT"], [q, kt], [f32(8, 4, 16, 16)], copies_inputs=(True, True))
    heads = L("x", "y", "", "")
    strategies, _ = enumerate_strategies(mm, MESH, [[heads], [heads]])
    assert [s.output for s in strategies if s.inputs == (heads, heads)] == [heads]
    # q rows (sequence) split over y: keys must arrive with their sequence (kT's last dim) unsplit.
    seq = L("x", "", "y", "")
    strategies, reasons = enumerate_strategies(mm, MESH, [[seq], [L("x", "", "", "y")]])
    assert [s.inputs[1] for s in strategies if s.inputs[0] == seq] == [L("x", "", "", "")]
    c = op_cost(mm, strategies[0], MESH, HW)
    assert {t.key.split(":")[1] for t in c.saved} == {"in0", "in1"}  # the matmul's own contiguous copies
    assert c.flops == 3 * 2 * (8 // 2) * 4 * (16 // 4) * 16 * 16  # fwd 2 m k n per batch entry, bwd twice that


def test_matmul_operand_missing_an_output_split_gets_its_gradient_all_reduced():
    # attention @ values with the value heads' features (n) split over y and the weights replicated over y:
    # dA = dY @ V^T sums over n, so each y-rank holds a partial dA (the bug behind the saved heads-split plan).
    att, v = f32(8, 4, 16, 16), f32(8, 4, 16, 16)
    mm = op("matmul", ["att", "v"], [att, v], [f32(8, 4, 16, 16)], grad_inputs=(True, True))
    la, lb = L("", "x", "", ""), L("", "x", "", "y")
    strategies, _ = enumerate_strategies(mm, MESH, [[la], [lb]])
    s = next(s for s in strategies if s.inputs == (la, lb))
    assert s.output == L("", "x", "", "y")
    grads = [c for c in op_cost(mm, s, MESH, HW).collectives if c.tag == "grad_input"]
    assert [(c.kind, c.axes, c.phase, c.bytes) for c in grads] == [
        ("all_reduce", ("y",), "backward", 8 * 2 * 16 * 16 * 4)]      # A's local block, over y only
    # Operands split alike (heads over x, batch over y): every gradient is local, nothing reduced.
    same = L("y", "x", "", "")
    s = next(s for s in enumerate_strategies(mm, MESH, [[same], [same]])[0] if s.inputs == (same, same))
    assert not op_cost(mm, s, MESH, HW).collectives
    # An operand without a gradient (computed from buffers alone) needs no reduction.
    mm.attrs["grad_inputs"] = (False, True)
    s = next(s for s in enumerate_strategies(mm, MESH, [[la], [lb]])[0] if s.inputs == (la, lb))
    assert not op_cost(mm, s, MESH, HW).collectives


def test_softmax_needs_its_dim_unsplit():
    sm = op("softmax", ["a"], [f32(8, 4, 16, 16)], [f32(8, 4, 16, 16)], dim=3)
    strategies, reasons = enumerate_strategies(sm, MESH, [[L("x", "", "", "y"), L("x", "y", "", "")]])
    assert [s.inputs[0] for s in strategies] == [L("x", "y", "", "")]
    assert reasons == ["softmax over dim 3 split over y"]


def test_broadcast_input_gradient_is_all_reduced():
    # tok_emb [8, 16, 64] + pos_emb [16, 64]: with the batch split over x, pos_emb's gradient is a partial
    # sum over x and is all-reduced (16*64*4 bytes); tok_emb's is not.
    add = op("elementwise", ["tok", "pos"], [f32(8, 16, 64), f32(16, 64)], [f32(8, 16, 64)], fn="add", saves=())
    strategies, _ = enumerate_strategies(add, MESH, [[L("x", "", "")], [L("", "")]])
    st = next(s for s in strategies if s.output == L("x", "", ""))
    assert st.inputs == (L("x", "", ""), L("", ""))
    c = op_cost(add, st, MESH, HW)
    assert [(x.kind, x.axes, x.bytes, x.tag) for x in c.collectives] == [("all_reduce", ("x",), 16 * 64 * 4, "grad_input")]
    assert c.saved == ()
    # The same add of a float mask built from buffers (no gradient, per the graph hint): no all-reduce.
    add.attrs["grad_inputs"] = (True, False)
    assert op_cost(add, st, MESH, HW).collectives == ()


def test_layer_norm_with_split_features():
    ln = op("layer_norm", ["x"], [f32(8, 16, 64)], [f32(8, 16, 64)],
            [ParamInfo("w", (64,), "float32", "weight"), ParamInfo("b", (64,), "float32", "bias")], normalized_shape=(64,))
    lay = L("x", "", "y")
    st = enumerate_strategies(ln, MESH, [[lay]])[0][0]
    c = op_cost(ln, st, MESH, HW)
    tokens = 4 * 16  # local tokens
    assert c.param_elems == 2 * 16
    assert sorted((x.phase, x.kind, x.axes, x.bytes, x.tag) for x in c.collectives) == sorted([
        ("forward", "all_reduce", ("y",), 8 * tokens, "stats"), ("backward", "all_reduce", ("y",), 8 * tokens, "stats"),
        ("backward", "all_reduce", ("x",), 16 * 4, "grad_weight"), ("backward", "all_reduce", ("x",), 16 * 4, "grad_bias")])
    assert c.saved_bytes == 4 * 16 * 16 * 4 + 2 * 4 * tokens  # input + fp32 mean and rstd


def test_embedding_schemes():
    emb = op("embedding", ["ids"], [TensorMeta((8, 16), "int64")], [f32(8, 16, 64)],
             [ParamInfo("wte", (1000, 64), "float32", "weight")])
    strategies, reasons = enumerate_strategies(emb, MESH)
    assert "vocab[T=y]: vocabulary 1000 not divisible by 4 (axis y)" not in reasons  # 1000 = 4 * 250
    st = next(s for s in strategies if s.scheme == "vocab" and s.option("T") == ("y",) and not s.option("sp"))
    c = op_cost(emb, st, MESH, HW)
    # ids [8/2, 16] (dp = x); each rank holds 250 rows; y [4, 16, 64] partial over y, all-reduced.
    assert c.param_elems == 250 * 64
    assert [(x.phase, x.kind, x.axes, x.bytes, x.tag) for x in c.collectives] == [
        ("forward", "all_reduce", ("y",), 4 * 16 * 64 * 4, "output"),
        ("backward", "all_reduce", ("x",), 250 * 64 * 4, "grad_weight")]
    assert c.saved_bytes == 4 * 16 * 8  # the ids
    sp = next(s for s in strategies if s.scheme == "vocab" and s.option("T") == ("y",) and s.option("sp"))
    assert sp.output == L("x", "y", "")
    _, reasons = enumerate_strategies(emb, Mesh((3,)))
    assert "vocab[T=x]: vocabulary 1000 not divisible by 3 (axis x)" in reasons


def test_vocab_parallel_cross_entropy_all_reduces_three_statistics():
    ce = op("cross_entropy", ["logits", "t"], [f32(128, 1000), TensorMeta((128,), "int64")], [f32()],
            fn="cross_entropy", reduction="mean")
    st = enumerate_strategies(ce, MESH, [[L("x", "y")], [L("x")]])[0][0]
    assert st.scheme == "vocab" and st.inputs[1] == L("x")
    c = op_cost(ce, st, MESH, HW)
    stats = [x for x in c.collectives if x.tag == "stats"]
    assert [(x.kind, x.axes, x.bytes) for x in stats] == [("all_reduce", ("y",), 4 * 64)] * 3
    assert [(x.kind, x.axes, x.bytes) for x in c.collectives if x.tag == "output"] == [("all_reduce", ("x",), 8)]
    local = enumerate_strategies(ce, MESH, [[L("x", "")], [L("x")]])[0][0]
    assert local.scheme == "follow" and not [x for x in op_cost(ce, local, MESH, HW).collectives if x.tag == "stats"]


@pytest.mark.parametrize("device, mask_bytes", [("cuda", 1), ("cpu", 2)])
def test_dropout_mask_bytes_depend_on_the_device(device, mask_bytes):
    meta = TensorMeta((8, 16, 64), "bfloat16")
    d = op("dropout", ["x"], [meta], [meta], p=0.1, training=True)
    st = enumerate_strategies(d, MESH, [[L("x", "", "y")]])[0][0]
    assert op_cost(d, st, MESH, HW, device=device).saved_bytes == 4 * 16 * 16 * mask_bytes
    off = op("dropout", ["x"], [meta], [meta], p=0.0, training=True)
    assert op_cost(off, enumerate_strategies(off, MESH, [[L("x", "", "y")]])[0][0], MESH, HW).saved_bytes == 0


def test_other_runs_replicated_with_a_note():
    o = op("other", ["x"], [f32(8, 16)], [f32(8, 16)])
    strategies, _ = enumerate_strategies(o, MESH, [[L("x", "")]])
    assert [s.inputs for s in strategies] == [(L("", ""),)]
    assert "no cost model" in op_cost(o, strategies[0], MESH, HW).notes[0]


def test_graph_hints_on_a_gpt_layer():
    from tests.cost_gpt_graph import gpt_layer_ops

    ops = {o.name: o for o in gpt_layer_ops(2, 8, 16, 2)}  # gpt_layer_ops calls mark_graph_hints
    assert ops["c_attn"].attrs["out_segments"] == 3 and "out_segments" not in ops["c_fc"].attrs
    assert ops["matmul"].attrs["copies_inputs"] == (True, True)     # q and k^T are transposed views
    assert ops["matmul_1"].attrs["copies_inputs"] == (False, True)  # the dropout output is contiguous
    assert ops["add_1"].attrs["grad_inputs"] == (False, True)       # the block input "x" is a graph input
    assert ops["masked_fill"].attrs["grad_inputs"] == (True, False)  # the mask comes from a buffer
    assert ops["matmul"].attrs["grad_inputs"] == (True, True)        # q, k and v come from c_attn
