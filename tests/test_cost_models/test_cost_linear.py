"""Linear strategies: parameter shards, collectives and bytes per scheme, reasons, interleave.

Shapes: x [b, s, K] = [8, 16, 64], W [N, K] = [128, 64] (+ bias [N]), fp32 (4 bytes). M = b s = 128.
"""

from __future__ import annotations

from collections import Counter

import pytest

from cost_models.hardware import load_profile
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, ParamInfo, TensorMeta
from cost_models.strategies import enumerate_strategies, op_cost
from cost_models.strategy import Strategy
from tests.cost_gpt_graph import assign, costs, gpt_layer_ops

HW = load_profile("h100-80gb")
b, s, K, N = 8, 16, 64, 128
M = b * s


def linear(k: int = K, n: int = N, bias: bool = True, name: str = "fc", dtype: str = "float32",
           tokens: tuple[int, int] = (b, s), **attrs) -> OpNode:
    params = [ParamInfo(f"{name}.weight", (n, k), dtype, "weight")]
    if bias:
        params.append(ParamInfo(f"{name}.bias", (n,), dtype, "bias"))
    return OpNode(name, "linear", "nn.Linear", ["x"], [TensorMeta((*tokens, k), dtype)],
                  [TensorMeta((*tokens, n), dtype)], params, attrs=attrs)


def find(op: OpNode, mesh: Mesh, scheme: str, **opts) -> Strategy:
    for st in enumerate_strategies(op, mesh)[0]:
        if st.scheme == scheme and all(st.option(k) == v for k, v in opts.items()):
            return st
    raise AssertionError(f"no {scheme} {opts}")


def colls(op, st, mesh):
    return [(c.phase, c.kind, "".join(c.axes), c.bytes, c.tag) for c in op_cost(op, st, mesh, HW).collectives]


CUBE = Mesh((2, 2, 2))  # N = q^3, q = 2
SQUARE = Mesh((4, 4))   # N = q^2, q = 4


@pytest.mark.parametrize("mesh, scheme, opts, divisor", [
    (CUBE, "3d", {"roles": ("x", "y", "z"), "save_input": "gathered"}, 8),       # W / q^3
    (CUBE, "3d_allreduce", {"roles": ("x", "y", "z"), "weight_shard": True}, 8),  # W / q^3 with the extra m split
    (CUBE, "3d_allreduce", {"roles": ("x", "y", "z"), "weight_shard": False}, 4),  # W / q^2
    (SQUARE, "2d", {"roles": ("x", "y"), "save_input": "gathered"}, 16),         # W / q^2
    (Mesh((4,)), "1d_col", {"T": ("x",), "sp": False}, 4),                       # W / t
    (Mesh((4,)), "1d_row", {"T": ("x",), "sp": False}, 4),
    (CUBE, "fsdp", {}, 8),                                                        # W / dp
    (CUBE, "replicate", {"dp": ("x", "y", "z")}, 1),                             # full
    (CUBE, "replicate", {"dp": ()}, 1),
])
def test_weight_elements_per_rank_exact(mesh, scheme, opts, divisor):
    op = linear(bias=False)
    assert op_cost(op, find(op, mesh, scheme, **opts), mesh, HW).param_elems * divisor == N * K


def test_bias_is_stored_like_the_output_features():
    # 3d: W/8 plus the bias split over the input axis i only (N/q); 1d_row: full bias.
    op = linear()
    assert op_cost(op, find(op, CUBE, "3d", roles=("x", "y", "z")), CUBE, HW).param_elems == N * K // 8 + N // 2
    mesh = Mesh((4,))
    assert op_cost(op, find(op, mesh, "1d_row", sp=False), mesh, HW).param_elems == N * K // 4 + N


def test_state_bytes_uses_bytes_per_param():
    op, mesh = linear(bias=False), Mesh((4,))
    st = find(op, mesh, "1d_col", sp=False)
    assert op_cost(op, st, mesh, HW, bytes_per_param="bf16_mixed").state_bytes == N * K // 4 * 18
    assert op_cost(op, st, mesh, HW, bytes_per_param=16).state_bytes == N * K // 4 * 16


def test_3d_collectives_match_the_table():
    # roles (w, i, o) = (x, y, z). x arrives [M/(w i), K/o] = [32, 32]; gathered over i: [64, 32] = 8 KiB.
    # W stored [N/i, K/(o w)] -> gathered over w: [64, 32] = 8 KiB. y partial [M/w, N/i] = [64, 64] = 16 KiB,
    # reduce-scattered over o. Backward: dY gathered over o (16 KiB), dX [64, 32] reduce-scattered over i,
    # dW [64, 32] reduce-scattered over w; bias grad [N/i] = 256 B all-reduced over y's token axes (w, o).
    op = linear()
    got = colls(op, find(op, CUBE, "3d", roles=("x", "y", "z"), save_input="gathered"), CUBE)
    assert got == [
        ("forward", "all_gather", "y", 8192, "input"),
        ("forward", "all_gather", "x", 8192, "weight"),
        ("forward", "reduce_scatter", "z", 16384, "output"),
        ("backward", "all_gather", "z", 16384, "grad_output"),
        ("backward", "reduce_scatter", "y", 8192, "grad_input"),
        ("backward", "reduce_scatter", "x", 8192, "grad_weight"),
        ("backward", "all_reduce", "xz", 256, "grad_bias"),
    ]
    # Saving only the shard (1/q^3 instead of 1/q^2) costs one more all-gather of x in backward.
    shard = colls(op, find(op, CUBE, "3d", roles=("x", "y", "z"), save_input="shard"), CUBE)
    assert Counter(shard) - Counter(got) == Counter({("backward", "all_gather", "y", 8192, "input"): 1})


def test_3d_allreduce_collectives_match_the_table():
    # roles (m, k, n) = (x, y, z): x [M/m, K/k] = [64, 32], y partial [64, N/n = 64] all-reduced over k (16 KiB);
    # dX [64, 32] all-reduced over n (8 KiB); dW [N/n, K/k] = [64, 32] all-reduced over m (8 KiB).
    op = linear(bias=False)
    got = colls(op, find(op, CUBE, "3d_allreduce", roles=("x", "y", "z"), weight_shard=False), CUBE)
    assert got == [
        ("forward", "all_reduce", "y", 16384, "output"),
        ("backward", "all_reduce", "z", 8192, "grad_input"),
        ("backward", "all_reduce", "x", 8192, "grad_weight"),
    ]


def _activation_side(op, st, mesh, checkpointed: bool) -> Counter:
    """Collectives on the input side (input / grad_input) and output side (output / grad_output); with
    checkpointing every forward collective runs twice."""
    out: Counter = Counter()
    for c in op_cost(op, st, mesh, HW).collectives:
        side = {"input": "in", "grad_input": "in", "output": "out", "grad_output": "out"}.get(c.tag)
        if side:
            out[(side, c.kind)] += 2 if (checkpointed and c.phase == "forward") else 1
    return out


def test_checkpointed_3d_vs_3d_allreduce_counts():
    # DESIGN section 1: with checkpointing, 3D costs 2 AG + 1 RS on the input side and 2 RS + 1 AG on the
    # output side; the all-reduce variant costs 3 all-reduces.
    op = linear()
    st3 = find(op, CUBE, "3d", roles=("x", "y", "z"), save_input="gathered")
    assert _activation_side(op, st3, CUBE, True) == Counter({("in", "all_gather"): 2, ("in", "reduce_scatter"): 1,
                                                              ("out", "reduce_scatter"): 2, ("out", "all_gather"): 1})
    st_ar = find(op, CUBE, "3d_allreduce", roles=("x", "y", "z"), weight_shard=False)
    assert _activation_side(op, st_ar, CUBE, True) == Counter({("out", "all_reduce"): 2, ("in", "all_reduce"): 1})
    # The op reports its forward part separately, which is what a checkpointed block pays again.
    c = op_cost(op, st3, CUBE, HW)
    assert c.recompute_s == pytest.approx(c.fwd_compute_s + c.fwd_comm_s) and 0 < c.fwd_comm_s < c.comm_s


def test_megatron_layer_has_four_all_reduces_of_bsh():
    # 1D over all 4 ranks: c_attn / c_fc all-reduce dX in backward, the projections all-reduce y in forward,
    # each b*s*h*2 bytes (bf16); nothing else communicates (no data-parallel axis, LN not split).
    bb, ss, hh, aa = 2, 16, 64, 4
    ops = gpt_layer_ops(bb, ss, hh, aa)
    mesh = Mesh((4,))

    def pick(op, strategies):
        want = "1d_row" if "c_proj" in op.name else "1d_col"
        return next(st for st in strategies if st.scheme == want and st.option("sp") is False)

    found = [(c.phase, c.kind, c.bytes, c.tag) for c in
             (x for cost in costs(ops, assign(ops, mesh, pick, {}), mesh, HW).values() for x in cost.collectives)]
    assert sorted(found) == sorted([("backward", "all_reduce", bb * ss * hh * 2, "grad_input")] * 2
                                   + [("forward", "all_reduce", bb * ss * hh * 2, "output")] * 2)


def test_3d_layer_chains_without_redistribution():
    # Consecutive 3D linears swap the input and output axes, so c_attn (x,y,z) -> attention -> c_proj (x,z,y)
    # and c_fc (x,y,z) -> GELU -> c_proj (x,z,y) need no conversion (assign fails otherwise).
    ops = gpt_layer_ops(8, 16, 64, 4)

    def pick(op, strategies):
        roles = ("x", "z", "y") if "c_proj" in op.name else ("x", "y", "z")
        return next(st for st in strategies if st.scheme == "3d" and st.option("roles") == roles
                    and st.option("save_input") == "gathered")

    chosen = assign(ops, CUBE, pick, {"x": Layout((("x", "y"), (), ("z",)))})
    assert chosen["c_attn"].output.interleave == 3  # the fused q/k/v output keeps its segments apart
    tally = Counter((c.kind, c.tag) for cost in costs(ops, chosen, CUBE, HW).values() for c in cost.collectives)
    assert tally == Counter({
        ("all_gather", "input"): 4, ("all_gather", "weight"): 4, ("reduce_scatter", "output"): 4,
        ("all_gather", "grad_output"): 4, ("reduce_scatter", "grad_input"): 4, ("reduce_scatter", "grad_weight"): 4,
        ("all_reduce", "grad_bias"): 4 + 2,   # 4 linear biases + 2 LN betas, over the token axes
        ("all_reduce", "grad_weight"): 2,     # 2 LN gammas over the token axes
        ("all_reduce", "stats"): 4,           # 2 LNs, forward and backward, over the feature axis
    })


def test_reasons_name_the_axis_that_does_not_divide():
    op = linear(k=1600, n=1600, tokens=(12, 16))
    strategies, reasons = enumerate_strategies(op, Mesh((3, 4)))
    assert "1d_col[T=x]: out_features 1600 not divisible by 3 (axis x)" in reasons
    assert not any(st.scheme == "1d_col" and st.option("T") == ("x",) for st in strategies)
    assert any(st.scheme == "1d_col" and st.option("T") == ("y",) for st in strategies)


def test_interleave_requires_each_segment_to_divide():
    op = linear(n=3 * 4, out_segments=3)  # three segments of 4 features
    strategies, reasons = enumerate_strategies(op, Mesh((8,)))
    assert not any(st.scheme == "1d_col" for st in strategies)
    assert "1d_col[T=x]: out_features 12 in 3 segments not divisible by 24 (axis x)" in reasons
    ok = [st for st in enumerate_strategies(op, Mesh((4,)))[0] if st.scheme == "1d_col"]
    assert ok and all(st.output.interleave == 3 and st.option("interleave") == 3 for st in ok)


def test_conv1d_weight_is_stored_transposed():
    op = OpNode("c", "linear", "Conv1D", ["x"], [TensorMeta((b, s, K), "float32")], [TensorMeta((b, s, N), "float32")],
                [ParamInfo("c.weight", (K, N), "float32", "weight")], attrs={"weight_transposed": True})
    st = find(op, Mesh((4,)), "1d_col", sp=False)
    assert dict(st.params)["weight"] == Layout(((), ("x",)))
    assert op_cost(op, st, Mesh((4,)), HW).param_elems == K * N // 4


def test_same_shapes_share_costs_but_keep_their_names():
    mesh = Mesh((4,))
    a, c = linear(name="a"), linear(name="c")
    c.inputs = ["other_input"]
    st = find(a, mesh, "1d_col", sp=False)
    ca, cc = op_cost(a, st, mesh, HW), op_cost(c, st, mesh, HW)
    assert ca.comm_s == cc.comm_s and ca.saved_bytes == cc.saved_bytes
    assert [t.key for t in ca.saved] == ["x:[-, -, -]"] and [t.key for t in cc.saved] == ["other_input:[-, -, -]"]


def test_clear_caches_gives_the_same_costs():
    from cost_models.strategies import clear_caches

    op, mesh = linear(), Mesh((4,))
    st = find(op, mesh, "1d_row", sp=True)
    before = op_cost(op, st, mesh, HW)
    clear_caches()
    assert op_cost(op, st, mesh, HW) == before
