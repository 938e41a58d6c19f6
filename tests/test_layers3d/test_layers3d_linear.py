"""ParallelLinear on 8 gloo ranks: every scheme and option against the dense layer (outputs, input /
weight / bias gradients, fp32 relative error <= 1e-5), the collectives it runs against a hand derivation
from the ARCHITECTURE table (with and without checkpointing), and the dense state dict round trip."""

from __future__ import annotations

import itertools
import math
import random
import zlib
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
from transformers.pytorch_utils import Conv1D  # imported before forking: heavy

from cost_models.mesh import Mesh
from cost_models.strategy import Collective
from tests.distributed import run_ranks
from tests.layers3d_helpers import SavedBytes, rel_err, with_recompute

pytestmark = pytest.mark.distributed


@dataclass(frozen=True)
class Case:
    mesh: tuple[int, ...]
    scheme: str
    roles: tuple[str, ...] = ()
    dp: tuple[str, ...] | None = None
    tokens: tuple[int, int] = (4, 3)
    k: int = 12
    n: int = 6
    bias: bool = True
    interleave: int = 1
    transposed: bool = False
    sp: bool = False
    save_input: str = "gathered"
    weight_shard: bool = False
    pass_tokens: bool = False  # give the layer token_shape (needed when a token axis lands on the sequence)


def cases() -> list[Case]:
    xyz = ("x", "y", "z")
    out = [
        Case((2, 2, 2), "replicate", tokens=(8, 3), k=6, n=10),
        Case((2, 2, 2), "replicate", tokens=(2, 12), k=6, n=10, bias=False, pass_tokens=True),
        Case((2, 2, 2), "fsdp", tokens=(8, 2), k=6, n=16),
        Case((2, 2, 2), "fsdp", tokens=(8, 2), k=6, n=16, transposed=True),   # N splits (stored dim 1 of [K, N])
        Case((2, 2, 2), "fsdp", tokens=(8, 2), k=16, n=10, transposed=True),  # N does not divide: K splits
        Case((2, 2, 2), "1d_col", xyz, tokens=(3, 2), k=6, n=16),
        Case((2, 2, 2), "1d_col", ("z",), tokens=(4, 3), k=5, n=6, interleave=3),
        Case((2, 2, 2), "1d_col", ("y", "z"), tokens=(2, 3), k=7, n=24, interleave=3, transposed=True),
        Case((2, 2, 2), "1d_col", xyz, tokens=(2, 16), k=6, n=8, sp=True),
        Case((2, 2, 2), "1d_col", ("z",), ("x", "y"), tokens=(4, 4), k=6, n=8, sp=True, bias=False),
        Case((2, 2, 2), "1d_col", ("y", "z"), ("x",), tokens=(2, 8), k=6, n=8, sp=True, save_input="shard"),
        Case((2, 2, 2), "1d_row", xyz, tokens=(3, 2), k=16, n=6),
        Case((2, 2, 2), "1d_row", ("x", "z"), ("y",), tokens=(2, 3), k=8, n=5, transposed=True),
        Case((2, 2, 2), "1d_row", xyz, tokens=(2, 16), k=8, n=6, sp=True),
        Case((2, 2, 2), "2d", ("y", "z"), ("x",), tokens=(4, 3), k=12, n=10),
        Case((2, 2, 2), "2d", ("z", "x"), ("y",), tokens=(4, 3), k=8, n=12, interleave=3, transposed=True),
        Case((2, 2, 2), "2d", ("x", "y"), ("z",), tokens=(2, 6), k=6, n=4, bias=False, pass_tokens=True),
        Case((8,), "1d_col", ("x",), tokens=(3, 2), k=5, n=16),
        Case((8,), "1d_row", ("x",), tokens=(3, 2), k=16, n=5),
        Case((8,), "1d_row", ("x",), tokens=(2, 8), k=16, n=5, sp=True),
        Case((8,), "replicate", tokens=(8, 2), k=5, n=3),
        Case((8,), "fsdp", tokens=(8, 2), k=5, n=16, bias=False),
    ]
    for i, roles in enumerate(itertools.permutations(xyz)):  # every role permutation of 3d and 3d_allreduce
        out.append(Case((2, 2, 2), "3d", roles, tokens=(4, 3), k=12, n=6, bias=i % 2 == 0,
                        save_input=("gathered", "shard")[i % 2], transposed=i == 2))
        out.append(Case((2, 2, 2), "3d_allreduce", roles, tokens=(2, 3), k=8, n=10, bias=i % 2 == 1,
                        weight_shard=i % 3 == 0, transposed=i == 3))
    out += [
        Case((2, 2, 2), "3d", ("z", "x", "y"), tokens=(2, 6), k=8, n=12, interleave=3, pass_tokens=True),
        Case((2, 2, 2), "3d", ("x", "y", "z"), tokens=(8, 1), k=4, n=6, save_input="shard"),
        Case((2, 2, 2), "3d_allreduce", ("y", "z", "x"), tokens=(2, 5), k=4, n=12, interleave=3, weight_shard=True),
    ]
    return out + random_cases(12, seed=3)


def random_cases(count: int, seed: int) -> list[Case]:
    """Random schemes, roles, token shapes, feature sizes and options (all that the mesh divides)."""
    from cost_models.linear_scheme import LinearScheme, LinearSchemeError, linear_plan

    rng = random.Random(seed)
    mesh = Mesh((2, 2, 2))
    out: list[Case] = []
    while len(out) < count:
        scheme = rng.choice(("replicate", "fsdp", "1d_col", "1d_row", "2d", "3d", "3d_allreduce"))
        n_roles = {"2d": 2, "3d": 3, "3d_allreduce": 3}.get(scheme, 0)
        if scheme.startswith("1d"):
            roles = tuple(a for a in mesh.axis_names if rng.random() < 0.6) or ("z",)  # mesh order, as offered
        else:
            roles = tuple(rng.sample(mesh.axis_names, n_roles))
        inter = rng.choice((1, 1, 3)) if scheme not in ("1d_row",) else 1
        transposed = rng.random() < 0.25
        sp = scheme.startswith("1d") and rng.random() < 0.4
        gathers = scheme in ("2d", "3d") or (scheme == "1d_col" and sp)
        c = Case((2, 2, 2), scheme, roles, tokens=(rng.choice((2, 4, 8)), rng.choice((1, 2, 3, 4, 6, 8))),
                 k=rng.choice((4, 8, 12, 16, 24)), n=rng.choice((4, 8, 12, 16, 24)) * inter,
                 bias=transposed or rng.random() < 0.7, interleave=inter, transposed=transposed, sp=sp,
                 save_input=rng.choice(("gathered", "shard")) if gathers else "gathered",
                 weight_shard=scheme == "3d_allreduce" and rng.random() < 0.5, pass_tokens=True)
        try:
            linear_plan(LinearScheme(c.scheme, c.roles, None, c.sp, c.save_input, c.weight_shard), c.tokens + (c.k,),
                        c.n, mesh, c.interleave)
        except LinearSchemeError:
            continue
        if c.k != c.n and c.tokens[0] * c.tokens[1] != c.k:  # batch != hidden, non-square weights
            out.append(c)
    return out


def expected_collectives(c: Case) -> list[Collective]:
    """The table of docs/ARCHITECTURE.md, derived by hand for fp32 (4 bytes) and one forward + backward."""
    mesh = Mesh(c.mesh)
    q = mesh.size
    roles = c.roles
    dp = tuple(a for a in mesh.axis_names if a not in roles) if c.dp is None else c.dp
    m, k, n, b = math.prod(c.tokens), c.k, c.n, 4
    out: list[Collective] = []

    def add(phase: str, kind: str, axes: tuple[str, ...], nbytes: float, tag: str) -> None:
        if axes:
            out.append(Collective(kind, axes, int(nbytes), phase, tag))

    fw, bw = "forward", "backward"
    bias_axes: tuple[str, ...] = dp
    bias_n = n
    if c.scheme == "replicate":
        add(bw, "all_reduce", dp, n * k * b, "grad_weight")
    elif c.scheme == "fsdp":
        add(fw, "all_gather", dp, n * k * b, "weight")
        add(bw, "all_gather", dp, n * k * b, "weight")
        add(bw, "reduce_scatter", dp, n * k * b, "grad_weight")
    elif c.scheme == "1d_col":
        t = roles
        if c.sp:
            add(fw, "all_gather", t, m / q(dp) * k * b, "input")
            if c.save_input == "shard":
                add(bw, "all_gather", t, m / q(dp) * k * b, "input")
        add(bw, "reduce_scatter" if c.sp else "all_reduce", t, m / q(dp) * k * b, "grad_input")
        add(bw, "all_reduce", dp, n / q(t) * k * b, "grad_weight")
        bias_n = n / q(t)
    elif c.scheme == "1d_row":
        t = roles
        add(fw, "reduce_scatter" if c.sp else "all_reduce", t, m / q(dp) * n * b, "output")
        if c.sp:
            add(bw, "all_gather", t, m / q(dp) * n * b, "grad_output")
            bias_axes = dp + t
        add(bw, "all_reduce", dp, n * k / q(t) * b, "grad_weight")
    elif c.scheme == "2d":
        r, cc = roles[:1], roles[1:]
        add(fw, "all_gather", cc, m / q(dp + r) * k * b, "input")
        if c.save_input == "shard":
            add(bw, "all_gather", cc, m / q(dp + r) * k * b, "input")
        add(fw, "all_gather", r, n / q(cc) * k * b, "weight")
        add(bw, "reduce_scatter", cc, m / q(dp + r) * k * b, "grad_input")
        add(bw, "reduce_scatter", r, n / q(cc) * k * b, "grad_weight")
        add(bw, "all_reduce", dp, n / q(cc) * k / q(r) * b, "grad_weight")
        bias_axes, bias_n = dp + r, n / q(cc)
    elif c.scheme == "3d":
        w, i, o = roles[:1], roles[1:2], roles[2:]
        x_g = m / q(dp + w) * k / q(o) * b
        add(fw, "all_gather", i, x_g, "input")
        add(fw, "all_gather", w, n / q(i) * k / q(o) * b, "weight")
        add(fw, "reduce_scatter", o, m / q(dp + w) * n / q(i) * b, "output")
        add(bw, "all_gather", o, m / q(dp + w) * n / q(i) * b, "grad_output")
        add(bw, "reduce_scatter", i, x_g, "grad_input")
        if c.save_input == "shard":
            add(bw, "all_gather", i, x_g, "input")
        add(bw, "reduce_scatter", w, n / q(i) * k / q(o) * b, "grad_weight")
        add(bw, "all_reduce", dp, n / q(i) * k / q(o + w) * b, "grad_weight")
        bias_axes, bias_n = dp + w + o, n / q(i)
    elif c.scheme == "3d_allreduce":
        mm, kk, nn_ = roles[:1], roles[1:2], roles[2:]
        add(fw, "all_reduce", kk, m / q(dp + mm) * n / q(nn_) * b, "output")
        add(bw, "all_reduce", nn_, m / q(dp + mm) * k / q(kk) * b, "grad_input")
        w_loc = n / q(nn_) * k / q(kk) * b
        if c.weight_shard:
            add(fw, "all_gather", mm, w_loc, "weight")
            add(bw, "all_gather", mm, w_loc, "weight")
            add(bw, "reduce_scatter", mm, w_loc, "grad_weight")
            add(bw, "all_reduce", dp, w_loc / q(mm), "grad_weight")
        else:
            add(bw, "all_reduce", dp + mm, w_loc, "grad_weight")
        bias_axes, bias_n = dp + mm, n / q(nn_)
    if c.bias:
        add(bw, "all_reduce", bias_axes, bias_n * b, "grad_bias")
    return out


def _check_case(c: Case, dm, rank: int, ckpt: bool) -> list[Collective]:
    from cost_models.linear_scheme import LinearScheme
    from layers3d import CommCounter, ParallelLinear, checkpoint, local_block, shard_tensor

    gen = torch.Generator().manual_seed(zlib.crc32(repr(c).encode()))
    dense = Conv1D(c.n, c.k) if c.transposed else torch.nn.Linear(c.k, c.n, bias=c.bias)
    with torch.no_grad():
        for p in dense.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    assert c.bias or not c.transposed, "HF Conv1D always has a bias"
    x_full = torch.randn(*c.tokens, c.k, generator=gen).requires_grad_()
    g_full = torch.randn(*c.tokens, c.n, generator=gen)
    dense(x_full).backward(g_full)
    y_full = dense(x_full).detach()

    scheme = LinearScheme(c.scheme, c.roles, c.dp, c.sp, c.save_input, c.weight_shard)
    layer = ParallelLinear.from_dense(dense, dm, scheme, interleave=c.interleave,
                                      token_shape=c.tokens if c.pass_tokens else None)
    mesh = dm.mesh
    shape_x, shape_y = c.tokens + (c.k,), c.tokens + (c.n,)
    xl, yl = layer.input_layout(shape_x), layer.output_layout(shape_y)
    x = shard_tensor(x_full.detach(), xl, mesh, rank).requires_grad_()
    with CommCounter() as cc:
        with SavedBytes(exclude=layer.parameters()) as saved:
            y = checkpoint(layer, x) if ckpt else layer(x)
        y.backward(shard_tensor(g_full, yl, mesh, rank))
    where = f"{c} ckpt={ckpt} rank {rank}"
    assert rel_err(y, shard_tensor(y_full, yl, mesh, rank)) <= 1e-5, where
    assert rel_err(x.grad, shard_tensor(x_full.grad, xl, mesh, rank)) <= 1e-5, where
    w_grad = local_block(dense.weight.grad, layer.weight_dims, mesh, rank, interleave=layer.weight_interleave,
                         interleave_dim=layer.weight_interleave_dim)
    assert rel_err(layer.weight.grad, w_grad) <= 1e-5, where
    if c.bias:
        b_grad = local_block(dense.bias.grad, layer.bias_dims, mesh, rank, interleave=c.interleave)
        assert rel_err(layer.bias.grad, b_grad) <= 1e-5, where
    else:
        assert layer.bias is None
    if not ckpt:
        state = layer.dense_state_dict()
        assert state.keys() == dense.state_dict().keys(), where
        assert all(torch.equal(state[key], v) for key, v in dense.state_dict().items()), where
    return cc.records, saved.bytes


def _check_all(rank: int) -> dict:
    from layers3d import DeviceMesh

    meshes = {shape: DeviceMesh(Mesh(shape)) for shape in ((2, 2, 2), (8,))}
    records = {}
    for i, c in enumerate(cases()):
        for ckpt in (False, True):
            records[(i, ckpt)], records[("saved", i, ckpt)] = _check_case(c, meshes[c.mesh], rank, ckpt)
    return records


@pytest.fixture(scope="module")
def measured() -> list[dict]:
    """One 8-rank run checks every case against dense (asserted inside the ranks) and returns the records."""
    return run_ranks(_check_all, 8, 150)


def test_every_scheme_matches_dense_and_the_table(measured: list[dict]) -> None:
    for i, c in enumerate(cases()):
        want = expected_collectives(c)
        for rank, res in enumerate(measured):
            assert Counter(res[(i, False)]) == Counter(want), (c, rank, res[(i, False)], want)
            assert Counter(res[(i, True)]) == Counter(with_recompute(want)), (c, rank)


def _linear_op(c: Case):  # -> (OpNode, Strategy | None)
    from cost_models.ops import OpNode, ParamInfo, TensorMeta
    from cost_models.strategies import enumerate_strategies

    w_shape = (c.k, c.n) if c.transposed else (c.n, c.k)
    params = [ParamInfo("l.weight", w_shape, "float32", "weight")]
    if c.bias:
        params.append(ParamInfo("l.bias", (c.n,), "float32", "bias"))
    op = OpNode("l", "linear", "nn.Linear", ["x"], [TensorMeta(c.tokens + (c.k,), "float32")],
                [TensorMeta(c.tokens + (c.n,), "float32")], params,
                attrs={"weight_transposed": c.transposed, "out_segments": c.interleave})
    mesh = Mesh(c.mesh)
    dp = tuple(a for a in mesh.axis_names if a not in c.roles) if c.dp is None else c.dp
    key = {"1d_col": "T", "1d_row": "T"}.get(c.scheme, "roles")
    for s in enumerate_strategies(op, mesh)[0]:
        if s.scheme != c.scheme or s.option("dp") != dp or (c.roles and s.option(key) != c.roles):
            continue
        if s.option("sp", False) != c.sp or s.option("weight_shard", False) != c.weight_shard:
            continue
        if s.option("save_input", "gathered") != c.save_input:
            continue
        return op, s
    return op, None


def test_layouts_and_collectives_equal_the_cost_model(measured: list[dict], full_enumeration) -> None:
    """cost_models.strategies prices the same collectives (kind, axes, bytes, phase, tag) and the same
    input / output / parameter layouts as the runtime measures and uses."""
    from cost_models.hardware import load_profile
    from cost_models.layout import Layout
    from cost_models.linear_scheme import LinearScheme, linear_plan
    from cost_models.strategies import op_cost

    hw = load_profile("cpu-gloo")
    for i, c in enumerate(cases()):
        op, strategy = _linear_op(c)
        assert strategy is not None, f"the cost model offers no strategy for {c}"
        mesh = Mesh(c.mesh)
        _, plan = linear_plan(LinearScheme(c.scheme, c.roles, c.dp, c.sp, c.save_input, c.weight_shard),
                              c.tokens + (c.k,), c.n, mesh, c.interleave)
        assert strategy.inputs[0] == plan.x_in, (c, strategy)
        assert strategy.outputs[0] == plan.y_out, (c, strategy)
        params = dict(strategy.params)
        w_dims = plan.w_store[::-1] if c.transposed else plan.w_store
        assert params["weight"].dims == w_dims, (c, strategy)
        if c.bias:
            feat = plan.y_out.dims[-1]
            assert params["bias"] == Layout((feat,), interleave=c.interleave if feat else 1), c
        cost = op_cost(op, strategy, mesh, hw, device="cpu")
        predicted = list(cost.collectives)
        x_bytes = 4 * math.prod(plan.x_in.local_shape(c.tokens + (c.k,), mesh))
        for rank, res in enumerate(measured):
            assert res[("saved", i, False)] == cost.saved_bytes, (c, rank, res[("saved", i, False)], cost.saved)
            assert res[("saved", i, True)] == x_bytes, (c, rank)  # checkpointed: only the input is kept
            assert Counter(res[(i, False)]) == Counter(predicted), (c, rank, res[(i, False)], predicted)
            assert Counter(res[(i, True)]) == Counter(with_recompute(predicted)), (c, rank)
