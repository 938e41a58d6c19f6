"""The op-family registry (cost_models/family.py): one registration per family carries its capture patterns,
its rule, its FLOP count and its scheme-map flag; the runtime builders (layers3d/builders.py) are keyed by
the same kinds."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import pytest
import torch
from torch import nn

import cost_models.strategies
from cost_models.calls import Act, Call, Param
from cost_models.family import (
    CORE_KINDS,
    FamilyError,
    classify_call,
    classify_module,
    families,
    family,
    flops_per_elem,
    is_leaf_module,
    map_kinds,
    op_family,
    op_kinds,
    prices_params,
)
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, TensorMeta
from cost_models.strategies import enumerate_strategies, registered_kinds
from layers3d.builders import LayerRequest, builder
from tests.distributed import run_ranks


def _call(op: str, args: tuple, in_meta: list[TensorMeta], out: TensorMeta, producers: list[OpNode] | None = None,
          level: str = "torch") -> Call:
    prods = producers or [OpNode(f"p{i}", "input", "x") for i in range(len(in_meta))]
    return Call(op, level, args, {}, in_meta, prods, [out])


def test_kinds_are_the_registered_families() -> None:
    kinds = op_kinds()
    assert set(CORE_KINDS) <= set(kinds)
    assert kinds == registered_kinds() == tuple(sorted(kinds))
    expected = {"linear", "embedding", "layer_norm", "matmul", "softmax", "dropout", "activation", "elementwise",
                "reshape", "permute", "split", "getitem", "contiguous", "cross_entropy", "reduction"}
    assert expected <= set(kinds)
    for f in families():  # each family's rule is defined in a module of the strategies package
        assert f.rule.__module__.startswith("cost_models.strategies."), f.kind


def test_every_strategies_module_is_imported_without_an_import_list() -> None:
    for m in pkgutil.iter_modules(cost_models.strategies.__path__):
        assert f"cost_models.strategies.{m.name}" in sys.modules


def test_a_kind_or_module_type_is_registered_once() -> None:
    with pytest.raises(FamilyError, match="already registered"):
        op_family("linear")(lambda op, mesh, c, d: iter(()))
    with pytest.raises(FamilyError, match="already belongs"):
        op_family("not_a_family_yet", modules=("torch.nn.modules.linear.Linear",),
                  module_attrs=lambda m: {})(lambda op, mesh, c, d: iter(()))
    assert family("not_a_family_yet") is None
    with pytest.raises(FamilyError, match="module_attrs"):
        op_family("not_a_family_either", modules=("x.Y",))


def test_torch_module_names_resolve_to_the_classes_capture_sees() -> None:
    for f in families():
        for qualname in f.modules:
            mod, _, cls = qualname.rpartition(".")
            if not mod.startswith("torch."):
                continue
            assert isinstance(getattr(importlib.import_module(mod), cls), type), qualname


@pytest.mark.parametrize(("module", "kind", "attrs"), [
    (nn.Linear(4, 3), "linear", {"in_features": 4, "out_features": 3, "has_bias": True, "weight_transposed": False}),
    (nn.Embedding(10, 4, padding_idx=1), "embedding", {"num_embeddings": 10, "embedding_dim": 4, "padding_idx": 1}),
    (nn.LayerNorm(6, eps=1e-6), "layer_norm", {"normalized_shape": (6,), "eps": 1e-6, "elementwise_affine": True}),
    (nn.Dropout(0.25), "dropout", {"p": 0.25, "training": True}),
    (nn.GELU(approximate="tanh"), "activation", {"fn": "gelu", "approximate": "tanh"}),
])
def test_leaf_modules_are_read_by_their_family(module: nn.Module, kind: str, attrs: dict) -> None:
    assert is_leaf_module(module)
    assert classify_module(module) == (kind, attrs)


def test_subclass_overriding_forward_is_not_a_leaf() -> None:
    class Plain(nn.Linear):
        pass

    class Custom(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    assert is_leaf_module(Plain(2, 2))
    assert not is_leaf_module(Custom(2, 2))
    assert not is_leaf_module(nn.Sequential())
    assert classify_module(nn.GRU(1, 1)) == ("other", {})  # capture makes it an opaque op (it holds parameters)


def test_hf_conv1d_is_a_transposed_linear() -> None:
    conv1d = pytest.importorskip("transformers.pytorch_utils").Conv1D
    m = conv1d(6, 4)  # nf=6 outputs, nx=4 inputs: weight [4, 6]
    assert is_leaf_module(m)
    assert classify_module(m) == ("linear", {"in_features": 4, "out_features": 6, "has_bias": True,
                                             "weight_transposed": True})


def test_one_op_name_two_families_by_operands() -> None:
    x, y = TensorMeta((2, 3, 4), "float32"), TensorMeta((2, 4, 5), "float32")
    out = TensorMeta((2, 3, 5), "float32")
    assert classify_call(_call("matmul", (Act(0), Act(1)), [x, y], out)) == ("matmul", {"transpose_b": False})
    w = Param("w", (4, 5), "float32")
    kind, attrs = classify_call(_call("matmul", (Act(0), w), [x], out))
    assert kind == "linear" and attrs["weight_transposed"] and attrs["out_features"] == 5
    assert classify_call(_call("flip", (Act(0), (2,)), [x], x)) == ("other", {})


def test_aten_and_torch_names_meet_in_one_family() -> None:
    x = TensorMeta((2, 3), "float32")
    torch_level = classify_call(_call("softmax", (Act(0), -1), [x], x))
    aten_level = classify_call(_call("_softmax", (Act(0), -1, False), [x], x, level="aten"))
    assert torch_level == ("softmax", {"dim": 1, "log": False})
    assert aten_level == ("softmax", {"dim": 1, "log": False})


def test_flops_and_map_come_from_the_registration() -> None:
    assert flops_per_elem("layer_norm") == 8 and flops_per_elem("softmax") == 5
    assert flops_per_elem("no_such_kind") == 1
    assert set(map_kinds()) == {"embedding", "layer_norm", "rms_norm", "linear", "matmul", "attention", "softmax",
                                "cross_entropy", "conv"}
    # the priced FLOPs of a memory-bound op are its family's count per local element
    op = OpNode("s", "softmax", "softmax", ["x"], [TensorMeta((4, 8), "float32")], [TensorMeta((4, 8), "float32")],
                attrs={"dim": 1})
    mesh = Mesh((2,))
    strategies, _ = enumerate_strategies(op, mesh, [[Layout((("x",), ()))]])
    from cost_models.hardware import load_profile
    from cost_models.strategies import op_cost
    cost = op_cost(op, strategies[0], mesh, load_profile("cpu-gloo"), device="cpu")
    assert cost.fwd_flops == 5 * 16


def test_families_that_price_their_parameters() -> None:
    """Every other family's op holding parameters is captured as an opaque op (run whole, states counted)."""
    assert {f.kind for f in families() if f.prices_params} == {"linear", "embedding", "layer_norm", "rms_norm", "conv",
                                                                 "opaque"}
    assert prices_params("opaque") and not prices_params("elementwise") and not prices_params("other")


def test_builders_are_keyed_by_registered_kinds() -> None:
    built = [k for k in op_kinds() if builder(k) is not None]
    assert set(built) == {"linear", "embedding", "layer_norm", "rms_norm", "cross_entropy", "dropout", "opaque", "conv"}


def _placements(rank: int) -> dict:
    from layers3d.mesh import DeviceMesh
    from layers3d.shard import local_block

    torch.manual_seed(0)
    dm = DeviceMesh(Mesh((2,)))
    x = TensorMeta((4, 6), "float32")
    out: dict = {}
    cases = [
        ("linear", "1d_col", {"T": ["x"], "dp": []}, {"weight": torch.randn(8, 6), "bias": torch.randn(8)},
         OpNode("l", "linear", "nn.Linear", ["x"], [x], [TensorMeta((4, 8), "float32")], attrs={})),
        ("embedding", "vocab", {"T": ["x"], "dp": [], "sp": False}, {"weight": torch.randn(10, 6)},
         OpNode("e", "embedding", "nn.Embedding", ["i"], [TensorMeta((4,), "int64")], [x], attrs={})),
        ("layer_norm", "follow", {}, {"weight": torch.randn(6), "bias": torch.randn(6)},
         OpNode("n", "layer_norm", "nn.LayerNorm", ["x"], [x], [x], attrs={"normalized_shape": (6,)})),
    ]
    for kind, scheme, options, params, op in cases:
        inputs = (Layout(((), ("x",))),) if kind == "layer_norm" else (None,)
        req = LayerRequest(op=op, scheme=scheme, options=options, inputs=inputs, outputs=(), params=params,
                           mesh=dm, device=torch.device("cpu"))
        layer = builder(kind)(req)
        for role, dense in params.items():
            placed = layer.stored_placement(role)
            local = getattr(layer, role)
            want = local_block(dense, placed.dims, dm.mesh, dm.rank, interleave=placed.interleave,
                               interleave_dim=placed.interleave_dim)
            out[(kind, role)] = (placed.dims, bool(torch.equal(local.detach(), want)))
    return out


@pytest.mark.distributed
def test_each_layer_says_how_it_stores_its_parameters() -> None:
    results = run_ranks(_placements, 2, 60)
    for r in results:
        assert r[("linear", "weight")] == ((("x",), ()), True)
        assert r[("linear", "bias")] == ((("x",),), True)
        assert r[("embedding", "weight")] == ((("x",), ()), True)
        assert r[("layer_norm", "weight")] == ((("x",),), True)
        assert r[("layer_norm", "bias")] == ((("x",),), True)
