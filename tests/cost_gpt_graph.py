"""Test helpers for the cost-model tests: a GPT layer's OpNodes built by hand, and layout propagation.

`gpt_layer_ops` mirrors what `planner.trace.tracer.capture` produces for one nanoGPT block (same kinds, attrs and node
names), so the cost model can be checked independently of capture; the captured graph is checked too.
`assign` walks ops in order, picks a strategy for each heavy op with a caller's predicate, and for every
other op the strategy that takes its producers' layouts as they are (no conversion), as the plan
builder's follow-merging does.
"""

from __future__ import annotations

from collections.abc import Callable

from cost_models.hardware import HardwareProfile
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, ParamInfo, TensorMeta
from cost_models.strategies import enumerate_strategies, mark_graph_hints, op_cost
from cost_models.strategy import OpCost, Strategy

HEAVY = ("linear", "embedding")


def _op(name: str, kind: str, inputs: list[str], in_meta: list[TensorMeta], outs: list[TensorMeta],
        params: list[ParamInfo] | None = None, **attrs: object) -> OpNode:
    return OpNode(name, kind, kind, inputs, in_meta, outs, params or [], block="h0", attrs=dict(attrs))


def gpt_layer_ops(b: int, s: int, h: int, a: int, dtype: str = "bfloat16", p: float = 0.1) -> list[OpNode]:
    """One pre-norm GPT block (nanoGPT), input node "x" of shape (b, s, h), causal mask buffer "mask"."""
    t = lambda *shape, dt=dtype: TensorMeta(tuple(shape), dt)  # noqa: E731
    hs = h // a
    x, heads, scores = t(b, s, h), t(b, a, s, hs), t(b, a, s, s)

    def lin(name: str, src: str, k: int, n: int) -> OpNode:
        return _op(name, "linear", [src], [t(b, s, k)], [t(b, s, n)],
                   [ParamInfo(f"{name}.weight", (n, k), dtype, "weight"), ParamInfo(f"{name}.bias", (n,), dtype, "bias")],
                   weight_transposed=False)

    def ln(name: str, src: str) -> OpNode:
        return _op(name, "layer_norm", [src], [x], [x], [ParamInfo(f"{name}.weight", (h,), dtype, "weight"),
                                                          ParamInfo(f"{name}.bias", (h,), dtype, "bias")],
                   normalized_shape=(h,))

    def ew(name: str, ins: list[str], metas: list[TensorMeta], out: TensorMeta, fn: str, saves: tuple = ()) -> OpNode:
        return _op(name, "elementwise", ins, metas, [out], fn=fn, saves=saves, saves_output=False)

    view_to_heads = lambda name, src: _op(name, "reshape", [src], [x], [t(b, s, a, hs)], shape=(b, s, a, hs))  # noqa: E731
    heads_t = lambda name, src: _op(name, "permute", [src], [t(b, s, a, hs)], [heads], dims=(0, 2, 1, 3))  # noqa: E731
    ops = [
        OpNode("x", "input", "x", outputs=[x]),
        OpNode("mask", "other", "get_attr", outputs=[t(1, 1, s, s, dt="bool")], block="h0"),
        ln("ln_1", "x"),
        lin("c_attn", "ln_1", h, 3 * h),
        _op("split", "split", ["c_attn"], [t(b, s, 3 * h)], [x, x, x], dim=2, sizes=(h, h, h)),
        _op("q", "getitem", ["split"], [x], [x], index=0),
        _op("k", "getitem", ["split"], [x], [x], index=1),
        _op("v", "getitem", ["split"], [x], [x], index=2),
        view_to_heads("view", "q"), heads_t("transpose", "view"),
        view_to_heads("view_1", "k"), heads_t("transpose_1", "view_1"),
        view_to_heads("view_2", "v"), heads_t("transpose_2", "view_2"),
        _op("transpose_3", "permute", ["transpose_1"], [heads], [t(b, a, hs, s)], dims=(0, 1, 3, 2)),
        _op("matmul", "matmul", ["transpose", "transpose_3"], [heads, t(b, a, hs, s)], [scores], transpose_b=True),
        ew("mul", ["matmul"], [scores], scores, "mul"),
        _op("mask_slice", "getitem", ["mask"], [t(1, 1, s, s, dt="bool")], [t(1, 1, s, s, dt="bool")],
            index=({"slice": (None, None, None)},) * 2 + ({"slice": (None, s, None)},) * 2),
        ew("masked_fill", ["mul", "mask_slice"], [scores, t(1, 1, s, s, dt="bool")], scores, "masked_fill", (1,)),
        _op("softmax", "softmax", ["masked_fill"], [scores], [scores], dim=3, log=False),
        _op("attn_dropout", "dropout", ["softmax"], [scores], [scores], p=p, training=True),
        _op("matmul_1", "matmul", ["attn_dropout", "transpose_2"], [scores, heads], [heads], transpose_b=False),
        _op("transpose_4", "permute", ["matmul_1"], [heads], [t(b, s, a, hs)], dims=(0, 2, 1, 3)),
        _op("contiguous", "contiguous", ["transpose_4"], [t(b, s, a, hs)], [t(b, s, a, hs)]),
        _op("view_3", "reshape", ["contiguous"], [t(b, s, a, hs)], [x], shape=(b, s, h)),
        lin("attn_c_proj", "view_3", h, h),
        _op("resid_dropout", "dropout", ["attn_c_proj"], [x], [x], p=p, training=True),
        ew("add_1", ["x", "resid_dropout"], [x, x], x, "add"),
        ln("ln_2", "add_1"),
        lin("c_fc", "ln_2", h, 4 * h),
        _op("gelu", "activation", ["c_fc"], [t(b, s, 4 * h)], [t(b, s, 4 * h)], fn="gelu", approximate="none"),
        lin("mlp_c_proj", "gelu", 4 * h, h),
        _op("mlp_dropout", "dropout", ["mlp_c_proj"], [x], [x], p=p, training=True),
        ew("add_2", ["add_1", "mlp_dropout"], [x, x], x, "add"),
    ]
    mark_graph_hints(ops)
    return ops


Pick = Callable[[OpNode, list[Strategy]], Strategy]


def assign(ops: list[OpNode], mesh: Mesh, pick: Pick, start: dict[str, Layout]) -> dict[str, Strategy]:
    """A strategy per op (see the module docstring). `start` gives the layouts of graph inputs, leaves
    and producers outside `ops`; leaves not in it are replicated; the rest follow from their producers."""
    chosen: dict[str, Strategy] = {}
    outs: dict[str, tuple[Layout, ...]] = {name: (lay,) for name, lay in start.items()}
    for op in ops:
        if op.name in outs:
            continue
        if not op.inputs:
            outs[op.name] = (start.get(op.name, Layout.replicated(len(op.out.shape))),)
            continue
        index = op.attrs.get("index") if op.kind == "getitem" and isinstance(op.attrs.get("index"), int) else 0
        cands = [[outs[src][index if len(outs[src]) > 1 else 0]] for src in op.inputs]
        strategies, reasons = enumerate_strategies(op, mesh, cands)
        if op.kind in HEAVY:
            s = pick(op, strategies)
        else:
            exact = [s for s in strategies if list(s.inputs) == [c[0] for c in cands]]
            assert exact, f"{op.name}: no strategy takes {[str(c[0]) for c in cands]}; {reasons}"
            s = exact[0]
        chosen[op.name] = s
        outs[op.name] = s.outputs
    return chosen


def costs(ops: list[OpNode], chosen: dict[str, Strategy], mesh: Mesh, hw: HardwareProfile,
          device: str = "cuda") -> dict[str, OpCost]:
    return {op.name: op_cost(op, chosen[op.name], mesh, hw, device=device) for op in ops if op.name in chosen}


def by_scheme(scheme: str, **options: object) -> Pick:
    """A pick function: the first strategy of `scheme` whose options include `options`."""
    def pick(op: OpNode, strategies: list[Strategy]) -> Strategy:
        for s in strategies:
            if s.scheme == scheme and all(s.option(k) == v for k, v in options.items()):
                return s
        raise AssertionError(f"{op.name}: no {scheme} strategy with {options} among {[s.label() for s in strategies]}")
    return pick
