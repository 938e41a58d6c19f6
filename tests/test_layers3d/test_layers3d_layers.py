"""LayerNorm (feature dim split or not), Embedding (replicate, fsdp, vocab, vocab+sp, hidden) and the
vocab-parallel cross-entropy on 8 gloo ranks: equal to the dense ops (outputs and every gradient, fp32
relative error <= 1e-5) and the collectives equal a hand derivation from docs/ARCHITECTURE.md."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch.nn import functional as F

from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode
from cost_models.strategy import Collective, OpCost, Strategy
from tests.distributed import run_ranks
from tests.layers3d_helpers import SavedBytes, rel_err, with_recompute

pytestmark = pytest.mark.distributed

MESH = (2, 2, 2)
FW, BW = "forward", "backward"

# (tokens, H, features F, token axes, seq axes, affine, bias, offset)
NORM_CASES = [
    ((8, 2), 6, (), ("x", "y", "z"), (), True, True, 0.0),
    ((4, 3), 8, ("z",), ("x", "y"), (), True, True, 3.0),
    ((2, 3), 12, ("y", "z"), ("x",), (), True, False, 0.0),
    ((2, 3), 6, ("x",), ("y",), (), True, True, 0.0),   # z holds replicas
    ((2, 8), 6, (), ("x",), ("y", "z"), True, True, 0.0),  # sequence parallel layout
    ((4, 2), 8, ("y",), ("z", "x"), (), False, False, 0.0),
]
# (scheme, axes, dp, sp, tokens, V, H, padding_idx)
EMB_CASES = [
    ("replicate", (), None, False, (8, 2), 16, 6, None),
    ("fsdp", (), None, False, (8, 2), 16, 6, None),
    ("fsdp", (), None, False, (8, 2), 12, 8, 3),          # V does not divide 8: H split
    ("vocab", ("z",), None, False, (4, 3), 16, 6, 9),
    ("vocab", ("x", "y", "z"), None, False, (2, 3), 16, 6, None),
    ("vocab", ("y", "z"), None, True, (2, 8), 16, 6, None),
    ("hidden", ("z",), None, False, (4, 3), 10, 6, None),
    ("1d_col", ("y", "x"), ("z",), False, (2, 3), 10, 8, None),   # the cost model's name for hidden
]
# (tokens, V, vocab axes, token axes)
CE_CASES = [
    ((4, 3), 16, ("z",), ("x", "y")),
    ((2, 3), 16, ("x", "y", "z"), ()),
    ((8, 2), 10, (), ("x", "y", "z")),
    ((2, 4), 12, ("y", "x"), ("z",)),
]


def norm_expected(case: tuple) -> list[Collective]:
    tokens, h, feat, tok, seq, affine, bias, _ = case
    mesh = Mesh(MESH)
    m_loc = math.prod(tokens) // mesh.size(tok + seq)
    out = []
    if feat:
        out += [Collective("all_reduce", feat, m_loc * 2 * 4, ph, "stats") for ph in (FW, BW)]
    if affine and tok + seq:
        out.append(Collective("all_reduce", tok + seq, h // mesh.size(feat) * 4, BW, "grad_weight"))
        if bias:
            out.append(Collective("all_reduce", tok + seq, h // mesh.size(feat) * 4, BW, "grad_bias"))
    return out


def emb_expected(case: tuple) -> list[Collective]:
    scheme, axes, dp, sp, tokens, v, h, _ = case
    mesh = Mesh(MESH)
    dp = tuple(a for a in mesh.axis_names if a not in axes) if dp is None else dp
    m_loc = math.prod(tokens) // mesh.size(dp)
    if scheme == "fsdp":
        return [Collective("all_gather", dp, v * h * 4, FW, "weight"),
                Collective("reduce_scatter", dp, v * h * 4, BW, "grad_weight")]
    out = []
    if scheme == "vocab":
        out.append(Collective("reduce_scatter" if sp else "all_reduce", axes, m_loc * h * 4, FW, "output"))
        if sp:
            out.append(Collective("all_gather", axes, m_loc * h * 4, BW, "grad_output"))
    w_loc = v * h // mesh.size(axes)
    if dp:
        out.append(Collective("all_reduce", dp, w_loc * 4, BW, "grad_weight"))
    return out


def ce_expected(case: tuple) -> list[Collective]:
    tokens, v, vocab, tok = case
    m_loc = math.prod(tokens) // Mesh(MESH).size(tok)
    out = [Collective("all_reduce", vocab, m_loc * 4, FW, "stats")] * 3 if vocab else []
    return out + ([Collective("all_reduce", tok, 2 * 4, FW, "output")] if tok else [])  # loss sum and count


def _check(rank: int) -> dict:
    from layers3d import (
        CommCounter,
        DeviceMesh,
        ParallelEmbedding,
        ParallelLayerNorm,
        checkpoint,
        local_block,
        shard_tensor,
        vocab_parallel_cross_entropy,
    )

    dm = DeviceMesh(Mesh(MESH))
    mesh = dm.mesh
    gen = torch.Generator().manual_seed(7)
    out: dict = {}
    for i, case in enumerate(NORM_CASES):
        tokens, h, feat, tok, seq, affine, bias, offset = case
        dense = torch.nn.LayerNorm(h, elementwise_affine=affine, bias=bias)
        with torch.no_grad():
            for p in dense.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        x = (torch.randn(*tokens, h, generator=gen) + offset).requires_grad_()
        g = torch.randn(*tokens, h, generator=gen)
        y = dense(x)
        y.backward(g)
        layer = ParallelLayerNorm.from_dense(dense, dm, features=feat, tokens=tok, seq=seq)
        lay = layer.layout(x.shape)
        xl = shard_tensor(x.detach(), lay, mesh, rank).requires_grad_()
        with CommCounter() as cc:
            with SavedBytes(exclude=layer.parameters()) as saved:
                yl = layer(xl)
            yl.backward(shard_tensor(g, lay, mesh, rank))
        assert rel_err(yl, shard_tensor(y.detach(), lay, mesh, rank)) <= 1e-5, case
        assert rel_err(xl.grad, shard_tensor(x.grad, lay, mesh, rank)) <= 1e-5, case
        for name, p in layer.named_parameters():
            assert rel_err(p.grad, local_block(getattr(dense, name).grad, (feat,), mesh, rank)) <= 1e-5, (case, name)
        state = layer.dense_state_dict()
        assert state.keys() == dense.state_dict().keys() and all(
            torch.equal(state[k], v) for k, v in dense.state_dict().items())
        out[("norm", i)], out[("norm_saved", i)] = cc.records, saved.bytes
        grads = [xl.grad] + [p.grad for p in layer.parameters()]
        xl.grad = None
        layer.zero_grad()
        with CommCounter() as cc:  # checkpointed: same gradients, forward collectives run again
            checkpoint(layer, xl).backward(shard_tensor(g, lay, mesh, rank))
        assert all(torch.equal(a, b) for a, b in zip(grads, [xl.grad] + [p.grad for p in layer.parameters()]))
        out[("norm_ckpt", i)] = cc.records

    for i, case in enumerate(EMB_CASES):
        scheme, axes, dp, sp, tokens, v, h, pad = case
        dense = torch.nn.Embedding(v, h, padding_idx=pad)
        with torch.no_grad():
            dense.weight.copy_(torch.randn(v, h, generator=gen))
        ids = torch.randint(0, v, tokens, generator=gen)
        if pad is not None:
            ids[0, 0] = pad
        g = torch.randn(*tokens, h, generator=gen)
        dense(ids).backward(g)
        layer = ParallelEmbedding.from_dense(dense, dm, scheme, axes=axes, dp=dp, sp=sp)
        ids_l = shard_tensor(ids, layer.ids_layout(ids.shape), mesh, rank)
        y_lay = layer.output_layout(tuple(tokens) + (h,))
        with CommCounter() as cc:
            with SavedBytes(exclude=layer.parameters()) as saved:
                y = layer(ids_l)
            y.backward(shard_tensor(g, y_lay, mesh, rank))
        assert rel_err(y, shard_tensor(dense(ids).detach(), y_lay, mesh, rank)) <= 1e-5, case
        assert rel_err(layer.weight.grad, local_block(dense.weight.grad, layer.weight_dims, mesh, rank)) <= 1e-5, case
        assert torch.equal(layer.dense_state_dict()["weight"], dense.weight)
        out[("emb", i)], out[("emb_saved", i)] = cc.records, saved.bytes
        grad = layer.weight.grad
        layer.zero_grad()
        with CommCounter() as cc:
            checkpoint(layer, ids_l).backward(shard_tensor(g, y_lay, mesh, rank))
        assert torch.equal(grad, layer.weight.grad), case
        out[("emb_ckpt", i)] = cc.records

    for i, case in enumerate(CE_CASES):
        tokens, v, vocab, tok = case
        logits = torch.randn(*tokens, v, generator=gen).requires_grad_()
        target = torch.randint(0, v, tokens, generator=gen)
        target[0, :2] = -100
        loss = F.cross_entropy(logits.reshape(-1, v), target.reshape(-1))
        loss.backward()
        ndim = len(tokens)
        t_lay = Layout(tuple(Layout.shard(ndim, 0, tok).dims))
        l_lay = Layout(t_lay.dims + (vocab,))
        lg = shard_tensor(logits.detach(), l_lay, mesh, rank).requires_grad_()
        with CommCounter() as cc, SavedBytes() as saved:
            total = vocab_parallel_cross_entropy(lg, shard_tensor(target, t_lay, mesh, rank), dm, vocab_axes=vocab,
                                                 token_axes=tok)
            total.backward()
        assert rel_err(total, loss.detach()) <= 1e-5, (case, float(total), float(loss))  # the whole loss, every rank
        assert rel_err(lg.grad, shard_tensor(logits.grad, l_lay, mesh, rank)) <= 1e-5, case
        out[("ce", i)], out[("ce_saved", i)] = cc.records, saved.bytes
    return out


@pytest.fixture(scope="module")
def measured() -> list[dict]:
    """One 8-rank run checks every case against dense (asserted inside the ranks) and returns the records."""
    return run_ranks(_check, 8, 90)


def test_norm_embedding_cross_entropy_match_dense_and_the_table(measured: list[dict]) -> None:
    for rank, res in enumerate(measured):
        for i, case in enumerate(NORM_CASES):
            assert Counter(res[("norm", i)]) == Counter(norm_expected(case)), (case, rank, res[("norm", i)])
            assert Counter(res[("norm_ckpt", i)]) == Counter(with_recompute(norm_expected(case))), (case, rank)
        for i, case in enumerate(EMB_CASES):
            assert Counter(res[("emb", i)]) == Counter(emb_expected(case)), (case, rank, res[("emb", i)])
            assert Counter(res[("emb_ckpt", i)]) == Counter(with_recompute(emb_expected(case))), (case, rank)
        for i, case in enumerate(CE_CASES):
            assert Counter(res[("ce", i)]) == Counter(ce_expected(case)), (case, rank, res[("ce", i)])


def _norm_layout(case: tuple) -> Layout:
    from layers3d.tokens import token_dims

    tokens, h, feat, tok, seq = case[:5]
    return Layout(token_dims(tokens, tok, seq, Mesh(MESH), "test") + (feat,))


def _predict(op: OpNode, candidates: list | None, pick: Callable[[Strategy], bool]) -> OpCost | None:
    from cost_models.hardware import load_profile
    from cost_models.strategies import enumerate_strategies, op_cost

    found = [s for s in enumerate_strategies(op, Mesh(MESH), candidates)[0] if pick(s)]
    if not found:
        return None
    assert len(found) == 1, found
    return op_cost(op, found[0], Mesh(MESH), load_profile("cpu-gloo"), device="cpu")


def test_norm_and_embedding_equal_the_cost_model(measured: list[dict], full_enumeration) -> None:
    from cost_models.ops import ParamInfo, TensorMeta

    for i, case in enumerate(NORM_CASES):
        tokens, h, feat, tok, seq, affine, bias = case[:7]
        params = [ParamInfo(f"ln.{n}", (h,), "float32", n) for n in ("weight", "bias")[: affine + (affine and bias)]]
        x = TensorMeta(tokens + (h,), "float32")
        op = OpNode("ln", "layer_norm", "nn.LayerNorm", ["x"], [x], [x], params, attrs={"normalized_shape": (h,)})
        lay = _norm_layout(case)
        cost = _predict(op, [[lay]], lambda s, lay=lay: s.inputs[0] == lay)
        for rank, res in enumerate(measured):
            assert Counter(res[("norm", i)]) == Counter(cost.collectives), (case, rank, res[("norm", i)], cost)
            assert res[("norm_saved", i)] == cost.saved_bytes, (case, rank, res[("norm_saved", i)], cost.saved)
    compared = 0
    for i, case in enumerate(EMB_CASES):
        scheme, axes, dp, sp, tokens, v, h, _ = case
        mesh = Mesh(MESH)
        dp = tuple(a for a in mesh.axis_names if a not in axes) if dp is None else dp
        op = OpNode("emb", "embedding", "nn.Embedding", ["ids"], [TensorMeta(tokens, "int64")],
                    [TensorMeta(tokens + (h,), "float32")], [ParamInfo("emb.weight", (v, h), "float32", "weight")])
        name = "1d_col" if scheme == "hidden" else scheme
        cost = _predict(op, None, lambda s, name=name, dp=dp, axes=axes, sp=sp: (
            s.scheme == name and s.option("dp") == dp and s.option("T", ()) == axes and s.option("sp", False) == sp))
        if cost is None:
            assert axes != tuple(a for a in mesh.axis_names if a in axes), case  # only non-mesh-order T is missing
            continue
        compared += 1
        for rank, res in enumerate(measured):
            assert Counter(res[("emb", i)]) == Counter(cost.collectives), (case, rank, res[("emb", i)], cost)
            assert res[("emb_saved", i)] == cost.saved_bytes, (case, rank, res[("emb_saved", i)], cost.saved)
    assert compared == len(EMB_CASES) - 1


def _ce_predicted(case: tuple) -> OpCost:
    from cost_models.ops import TensorMeta

    tokens, v, vocab, tok = case
    t_lay = Layout(Layout.shard(len(tokens), 0, tok).dims)
    op = OpNode("ce", "cross_entropy", "F.cross_entropy", ["logits", "t"],
                [TensorMeta(tokens + (v,), "float32"), TensorMeta(tokens, "int64")], [TensorMeta((), "float32")])
    return _predict(op, [[Layout(t_lay.dims + (vocab,))], [t_lay]], lambda s: True)


def test_cross_entropy_collectives_and_saved_bytes_equal_the_cost_model(measured: list[dict]) -> None:
    for i, case in enumerate(CE_CASES):
        cost = _ce_predicted(case)
        for res in measured:
            assert Counter(res[("ce", i)]) == Counter(cost.collectives), (case, res[("ce", i)], cost.collectives)
            assert res[("ce_saved", i)] == cost.saved_bytes, (case, res[("ce_saved", i)], cost.saved)
