"""Saved activations of a GPT layer against Korthikanti et al. 2022 and against torch's own autograd.

Per layer, 16-bit activations, dropout with 1-byte masks (CUDA), s = sequence, b = batch, h = hidden,
a = heads, the paper counts (bytes):
  attention: LN input 2sbh, QKV input 2sbh, Q and K 4sbh, softmax output 2as^2b, dropout mask as^2b,
             dropout output 2as^2b, V 2sbh, output-projection input 2sbh, dropout mask sbh  = 11sbh + 5as^2b
  MLP:       LN input 2sbh, fc1 input 2sbh, GELU input 8sbh, fc2 input 8sbh, dropout mask sbh = 21sbh
  total sbh(34 + 5as/h).
Two terms the paper neglects are stated explicitly: each layer norm's mean and rstd (2 LNs x 2 x 4 bytes
x bs on CUDA; in the input dtype on CPU) and the bool causal mask masked_fill keeps (s^2 bytes).
With Megatron 1D tensor parallelism of degree t (c_attn, c_fc column-parallel; projections row-parallel)
the LN inputs, the QKV/fc1 inputs and the two residual dropout masks stay whole (10sbh); Q, K, V, the
projection inputs, GELU (24sbh) and the attention scores (5as^2b) are split t ways. With sequence
parallelism as well, everything is split: sbh(34/t + 5as/(ht)).
On CPU dropout keeps a mask of the input's dtype: sbh(36 + 6as/h).
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from cost_models.hardware import load_profile
from cost_models.layout import Layout
from cost_models.memory import unique_saved_bytes
from cost_models.mesh import Mesh
from cost_models.strategies import mark_graph_hints
from tests.cost_gpt_graph import assign, by_scheme, costs, gpt_layer_ops

HW = load_profile("a100-80gb")
B, S, H, A = 2, 32, 64, 4


def _saved(ops, mesh, pick, start=None, device="cuda") -> int:
    chosen = assign(ops, mesh, pick, start or {})
    return unique_saved_bytes(t for c in costs(ops, chosen, mesh, HW, device).values() for t in c.saved)


def _megatron(sp: bool):
    def pick(op, strategies):
        if "c_proj" in op.name:
            return by_scheme("1d_row", sp=sp)(op, strategies)
        return by_scheme("1d_col", sp=sp, **({"save_input": "shard"} if sp else {}))(op, strategies)
    return pick


def _extra(b: int, s: int, ln_stat_bytes: int = 4, t: int = 1) -> Fraction:
    """The terms Korthikanti et al. neglect: LN mean + rstd of 2 layer norms, and the s x s bool mask."""
    return Fraction(2 * 2 * ln_stat_bytes * b * s, t) + s * s


def test_dense_layer_matches_korthikanti_cuda():
    got = _saved(gpt_layer_ops(B, S, H, A), Mesh((1,)), by_scheme("replicate", dp=()))
    paper = S * B * H * (34 + Fraction(5 * A * S, H))
    assert got == paper + _extra(B, S)


def test_dense_layer_cpu_semantics():
    # CPU dropout saves a bf16 noise tensor (2 bytes/elem): +sbh per residual mask pair, +as^2b for attention.
    got = _saved(gpt_layer_ops(B, S, H, A), Mesh((1,)), by_scheme("replicate", dp=()), device="cpu")
    assert got == S * B * H * (36 + Fraction(6 * A * S, H)) + _extra(B, S, ln_stat_bytes=2)


@pytest.mark.parametrize("t", [2, 4])
def test_megatron_1d_layer(t):
    got = _saved(gpt_layer_ops(B, S, H, A), Mesh((t,)), _megatron(sp=False))
    paper = S * B * H * (10 + Fraction(24, t) + Fraction(5 * A * S, H * t))
    assert got == paper + _extra(B, S)


@pytest.mark.parametrize("t", [2, 4])
def test_megatron_1d_with_sequence_parallel(t):
    # The block input arrives sequence-split; linears save their input shard and gather it again.
    start = {"x": Layout(((), ("x",), ()))}
    got = _saved(gpt_layer_ops(B, S, H, A), Mesh((t,)), _megatron(sp=True), start)
    paper = S * B * H * (Fraction(34, t) + Fraction(5 * A * S, H * t))
    assert got == paper + _extra(B, S, t=t)  # LN stats split too; the mask is whole (heads, not rows, are split)


def _captured_block(dtype=torch.bfloat16):
    from planner.models.gpt import build_gpt
    from planner.trace.tracer import capture

    model, example = build_gpt("gpt-tiny", device="meta", dropout=0.1, dtype=dtype, n_layer=1)
    graph = capture(model, example)
    ops = list(graph)
    mark_graph_hints(ops)
    block = graph.blocks[0]
    body = [op for op in ops if op.name in set(block.nodes)]
    first = body[0]  # the block's first layer norm; its input comes from outside the block
    return model.config, body, first.inputs[0]


def test_captured_gpt_layer_matches_korthikanti():
    cfg, body, x = _captured_block()
    b, s, h, a = cfg.batch_size, cfg.seq_len, cfg.n_embd, cfg.n_head
    dense = _saved(body, Mesh((1,)), by_scheme("replicate", dp=()), {x: Layout.replicated(3)})
    assert dense == s * b * h * (34 + Fraction(5 * a * s, h)) + _extra(b, s)
    t = 2
    tp = _saved(body, Mesh((t,)), _megatron(sp=False), {x: Layout.replicated(3)})
    assert tp == s * b * h * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t)) + _extra(b, s)


def test_cpu_prediction_equals_autograd_saved_tensors():
    """Run the real bf16 block on CPU and count the unique storages autograd saves (parameters
    excluded): the CPU-semantics prediction on the captured graph must equal it byte for byte."""
    from planner.models.gpt import Block

    cfg, body, x_name = _captured_block()
    predicted = _saved(body, Mesh((1,)), by_scheme("replicate", dp=()), {x_name: Layout.replicated(3)},
                       device="cpu")
    torch.manual_seed(0)
    block = Block(cfg).to(torch.bfloat16)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    x = torch.randn(cfg.batch_size, cfg.seq_len, cfg.n_embd, dtype=torch.bfloat16, requires_grad=True)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    assert predicted == sum(storages.values())
