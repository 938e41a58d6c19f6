"""Edge (redistribution) costs: same layout is free; known conversions give the expected collectives."""

from __future__ import annotations

import pytest

from cost_models.comm import collective_seconds
from cost_models.edges import edge_cost
from cost_models.hardware import load_profile
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import TensorMeta

HW = load_profile("a100-80gb")
MESH = Mesh((2, 4))
T = TensorMeta((8, 16, 64), "bfloat16")  # 16 KiB in all


def kinds(e):
    return [(c.phase, c.kind, "".join(c.axes), c.bytes) for c in e.collectives]


def test_same_layout_costs_nothing():
    lay = Layout((("x",), (), ("y",)))
    e = edge_cost(T, lay, lay, MESH, HW)
    assert e.collectives == () and e.seconds == 0 and e.fwd_seconds == 0 and e.bytes == 0


def test_gather_forward_slice_backward():
    # [x, -, -] -> replicated: all-gather the full 16 KiB in forward; the gradient is just sliced.
    e = edge_cost(T, Layout((("x",), (), ())), Layout.replicated(3), MESH, HW)
    assert kinds(e) == [("forward", "all_gather", "x", 16384)]
    assert e.seconds == e.fwd_seconds == pytest.approx(collective_seconds(e.collectives[0], MESH, HW))
    assert e.transient_bytes == 16384


def test_slice_forward_gather_backward():
    e = edge_cost(T, Layout.replicated(3), Layout((("x",), (), ())), MESH, HW)
    assert kinds(e) == [("backward", "all_gather", "x", 16384)] and e.fwd_seconds == 0 < e.seconds


def test_moving_a_split_to_another_dim_is_an_all_to_all():
    # [y, -, -] -> [-, -, y]: local 4 KiB blocks exchanged both ways.
    e = edge_cost(T, Layout((("y",), (), ())), Layout(((), (), ("y",))), MESH, HW)
    assert kinds(e) == [("forward", "all_to_all", "y", 4096), ("backward", "all_to_all", "y", 4096)]


def test_partial_sum_is_reduced_and_its_gradient_is_free():
    e = edge_cost(T, Layout(((), (), ()), partial=("x",)), Layout(((), ("x",), ())), MESH, HW)
    assert kinds(e) == [("forward", "reduce_scatter", "x", 16384), ("backward", "all_gather", "x", 16384)]
    e = edge_cost(T, Layout(((), (), ()), partial=("x",)), Layout.replicated(3), MESH, HW)
    assert kinds(e) == [("forward", "all_reduce", "x", 16384)]


def test_integer_tensors_carry_no_gradient():
    ids = TensorMeta((8, 16), "int64")
    e = edge_cost(ids, Layout.replicated(2), Layout((("x",), ())), MESH, HW)
    assert e.collectives == () and e.seconds == 0
