"""Slicing dense tensors into layout blocks and putting them back (planner/apply_shard.py)."""

from __future__ import annotations

import pytest
import torch

from cost_models.layout import Layout
from cost_models.mesh import Mesh
from planner.apply_shard import ShardError, assemble_blocks, block_index, local_block

MESH = Mesh((2, 2, 2))


def test_block_index_is_mixed_radix_first_axis_outermost() -> None:
    lay = Layout.shard(1, 0, ("z", "x"))
    coords = {"x": 1, "y": 0, "z": 1}
    assert block_index(lay, 0, MESH, coords) == (1 * 2 + 1, 4)
    coords = {"x": 0, "y": 1, "z": 1}
    assert block_index(lay, 0, MESH, coords) == (2, 4)


def test_local_block_known_values() -> None:
    full = torch.arange(8)
    lay = Layout.shard(1, 0, ("x", "y"))
    assert local_block(full, lay, MESH, {"x": 1, "y": 0, "z": 0}).tolist() == [4, 5]
    assert local_block(full, lay, MESH, {"x": 0, "y": 1, "z": 1}).tolist() == [2, 3]


def test_interleaved_last_dim_takes_its_block_of_every_segment() -> None:
    full = torch.arange(12).view(1, 12)
    lay = Layout(((), ("x",)), interleave=3)
    assert local_block(full, lay, MESH, {"x": 1, "y": 0, "z": 0}).tolist() == [[2, 3, 6, 7, 10, 11]]
    assert local_block(full, lay, MESH, {"x": 0, "y": 0, "z": 0}).tolist() == [[0, 1, 4, 5, 8, 9]]


@pytest.mark.parametrize("layout", [
    Layout.replicated(3),
    Layout(((), ("x",), ("z", "y"))),
    Layout((("y",), (), ("x", "z"))),
    Layout((("x", "y"), (), ("z",)), interleave=3),
    Layout(((), ("z",), ("x", "y")), interleave=3),
])
def test_assemble_inverts_local_block_on_every_rank(layout: Layout) -> None:
    full = torch.randn(4, 6, 24)
    blocks = [local_block(full, layout, MESH, MESH.coords(r)) for r in range(MESH.world_size)]
    for b in blocks:
        assert tuple(b.shape) == layout.local_shape(full.shape, MESH)
    assert torch.equal(assemble_blocks(blocks, layout, MESH, full.shape), full)


def test_every_element_is_held_by_exactly_the_ranks_of_its_block() -> None:
    full = torch.arange(4 * 8).view(4, 8)
    lay = Layout((("y",), ("z", "x")))
    owners = torch.zeros(4, 8, dtype=torch.long)
    for r in range(MESH.world_size):
        b = local_block(full, lay, MESH, MESH.coords(r))
        owners.view(-1)[b.reshape(-1)] += 1
    assert torch.equal(owners, torch.ones(4, 8, dtype=torch.long))  # no replica axis left: one owner each


def test_meta_tensors_give_local_shapes() -> None:
    full = torch.empty(8, 16, device="meta")
    out = local_block(full, Layout((("x",), ("y", "z"))), MESH, MESH.coords(5))
    assert out.device.type == "meta" and tuple(out.shape) == (4, 4)


def test_shape_mismatch_is_a_named_error() -> None:
    with pytest.raises(ShardError, match="cannot be split"):
        local_block(torch.zeros(3, 4), Layout.shard(2, 0, ("x",)), MESH, MESH.coords(0))
    blocks = [torch.zeros(2, 4)] * 8
    with pytest.raises(ShardError, match="block of rank 0"):
        assemble_blocks(blocks, Layout.shard(2, 0, ("x", "y")), MESH, (4, 4))
