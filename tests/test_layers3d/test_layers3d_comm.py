"""DeviceMesh groups and collectives over any ordered subset of axes, checked on 8 gloo ranks against
results computed from every rank's (deterministic) local data; CommCounter bytes and phases."""

from __future__ import annotations

import itertools

import pytest
import torch

from cost_models.mesh import Mesh
from cost_models.strategy import Collective
from tests.distributed import run_ranks

pytestmark = pytest.mark.distributed


def _local(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float32).reshape(shape) + 1000.0 * rank)


def _members(mesh: Mesh, rank: int, axes: tuple[str, ...]) -> list[int]:
    return next(g for g in mesh.groups(axes) if rank in g)


def _ordered_subsets(names: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [p for k in range(1, len(names) + 1) for c in itertools.combinations(names, k)
            for p in itertools.permutations(c)]


def _check_collectives(rank: int, shape: tuple[int, ...]) -> int:
    from layers3d import CommCounter, DeviceMesh, all_gather, all_reduce, all_to_all, broadcast, reduce_scatter
    from layers3d.comm import cat_chunks, split_chunks

    mesh = Mesh(shape)
    dm = DeviceMesh(mesh)
    assert dm.coords == mesh.coords(rank)
    checked = 0
    for axes in _ordered_subsets(mesh.axis_names):
        members = _members(mesh, rank, axes)
        n = len(members)
        pos = members.index(rank)
        assert dm.group_rank(axes) == pos, (axes, dm.group_rank(axes), pos)
        x = _local(rank, (2, 3 * n, 4))
        with CommCounter() as cc:
            # all_gather on dims 0 and 1, plain and interleaved (3 segments on the last dim)
            for dim in (0, 1):
                got = all_gather(x, dim, axes, dm, tag="edge")
                assert torch.equal(got, torch.cat([_local(m, (2, 3 * n, 4)) for m in members], dim))
            xi = x.transpose(1, 2).contiguous()  # (2, 4, 3n): last dim = 3 segments of n blocks
            got = all_gather(xi, -1, axes, dm, interleave=3)
            want = cat_chunks([_local(m, (2, 3 * n, 4)).transpose(1, 2) for m in members], -1, 3)
            assert torch.equal(got, want)
            # reduce_scatter: the sum of everyone's chunk at my position
            got = reduce_scatter(x, 1, axes, dm)
            want = sum(split_chunks(_local(m, (2, 3 * n, 4)), 1, n)[pos] for m in members)
            assert torch.equal(got, want)
            got = reduce_scatter(xi, -1, axes, dm, interleave=3)
            want = sum(split_chunks(_local(m, (2, 3 * n, 4)).transpose(1, 2), -1, n, 3)[pos] for m in members)
            assert torch.equal(got, want)
            # all_reduce sum and max
            assert torch.equal(all_reduce(x, axes, dm), sum(_local(m, x.shape) for m in members))
            assert torch.equal(all_reduce(x, axes, dm, op="max"), _local(max(members), x.shape))
            # all_to_all: gather dim 0, scatter dim 1
            got = all_to_all(x, 0, 1, axes, dm)
            want = torch.cat([split_chunks(_local(m, x.shape), 1, n)[pos] for m in members], 0)
            assert torch.equal(got, want)
            # broadcast from the member at position n - 1
            assert torch.equal(broadcast(x, axes, dm, src=n - 1), _local(members[-1], x.shape))
        b = 4 * x.numel()
        kinds = [(c.kind, c.bytes) for c in cc.records]
        assert kinds == [("all_gather", b * n)] * 3 + [("reduce_scatter", b)] * 2 + [("all_reduce", b)] * 2 + [
            ("all_to_all", b), ("broadcast", b)], kinds
        assert all(c.axes == axes and c.phase == "forward" for c in cc.records)
        assert cc.records[0].tag == "edge"
        checked += 1
    # empty axes: no-op, nothing recorded
    with CommCounter() as cc:
        y = _local(rank, (2, 2))
        assert all_reduce(y, (), dm) is y and all_gather(y, 0, (), dm) is y
    assert cc.records == []
    return checked


def _check_phases(rank: int) -> list[Collective]:
    """Forward / backward / recompute phases, through a checkpointed function with one collective."""
    from cost_models.layout import Layout
    from layers3d import CommCounter, DeviceMesh, checkpoint, redistribute

    dm = DeviceMesh(Mesh((2, 2, 2)))
    src, dst = Layout((("x",), ())), Layout(((), ()))
    x = torch.randn(4, 6, requires_grad=True)

    def block(t: torch.Tensor) -> torch.Tensor:
        return redistribute(t * 2, src, dst, dm, (8, 6)).sin()

    with CommCounter() as cc:
        checkpoint(block, x).sum().backward()
    with CommCounter() as plain:
        block(x).sum().backward()
    return [cc.records, plain.records]


def test_collectives_every_ordered_subset_of_axes() -> None:
    n_subsets = len(_ordered_subsets(("x", "y", "z")))
    assert run_ranks(_check_collectives, 8, 90, args=((2, 2, 2),)) == [n_subsets] * 8


def test_collectives_on_mixed_axis_sizes() -> None:
    assert run_ranks(_check_collectives, 8, 60, args=((4, 2),)) == [len(_ordered_subsets(("x", "y")))] * 8


def test_phases_forward_backward_recompute() -> None:
    results = run_ranks(_check_phases, 8, 60)
    ag = 8 * 6 * 4  # all-gather output bytes
    for ckpt, plain in results:
        assert ckpt == [Collective("all_gather", ("x",), ag, "forward", "edge"),
                        Collective("all_gather", ("x",), ag, "recompute", "edge")]
        # backward of an all-gather is a slice: no collective in backward
        assert plain == [Collective("all_gather", ("x",), ag, "forward", "edge")]
