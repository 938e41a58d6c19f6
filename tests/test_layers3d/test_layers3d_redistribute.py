"""redistribute() on 8 gloo ranks: random layout pairs (nested splits, partial sums, interleave) on a
2x2x2 and a flat mesh of 8. Forward output equals the dense tensor's block, backward gives the complete
gradient's block, and the recorded collectives are exactly plan_redistribution's / backward_steps' steps."""

from __future__ import annotations

import random

import pytest
import torch

from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.strategy import Collective
from tests.distributed import run_ranks

pytestmark = pytest.mark.distributed


def random_layout(rng: random.Random, ndim: int, mesh: Mesh, partial_ok: bool = True,
                  allowed_partial: tuple[str, ...] = ()) -> Layout:
    """Each mesh axis goes to a random dim (random nesting order), to a partial sum, or is replicated."""
    dims: list[list[str]] = [[] for _ in range(ndim)]
    partial: list[str] = []
    for a in rng.sample(mesh.axis_names, len(mesh.axis_names)):
        r = rng.random()
        if a in allowed_partial and rng.random() < 0.5:
            partial.append(a)
        elif partial_ok and not allowed_partial and r < 0.2:
            partial.append(a)
        elif r < 0.75:
            dims[rng.randrange(ndim)].append(a)
    return Layout(tuple(tuple(d) for d in dims), tuple(partial), rng.choice((1, 1, 3)))


def _cases(mesh: Mesh, n: int, seed: int) -> list[tuple[tuple[int, ...], Layout, Layout]]:
    rng = random.Random(seed)
    out = [  # hand-picked: slice into an interleaved layout, an all-to-all, a reduce-scatter
        ((8, 24), Layout(((), ())), Layout(((), (mesh.axis_names[0],)), interleave=3)),
        ((8, 24), Layout(((mesh.axis_names[0],), ())), Layout(((), (mesh.axis_names[0],)))),
        ((8, 24), Layout(((), ()), (mesh.axis_names[0],)), Layout(((mesh.axis_names[0],), ()))),
    ]
    while len(out) < n:
        ndim = rng.choice((2, 3))
        shape = tuple(rng.choice((8, 16)) for _ in range(ndim - 1)) + (24,)
        src = random_layout(rng, ndim, mesh)
        dst = random_layout(rng, ndim, mesh, allowed_partial=src.partial)
        dst = Layout(dst.dims, tuple(a for a in src.partial if a in dst.partial), dst.interleave)  # src order
        out.append((shape, src, dst))
    return out


def _weights(layout: Layout, mesh: Mesh, rank: int) -> float:
    """A rank's share of a partial sum: a product over partial axes of 2(c+1)/(n(n+1)) (sums to 1)."""
    w = 1.0
    coords = mesh.coords(rank)
    for a in layout.partial:
        n = mesh.axis_size(a)
        w *= 2 * (coords[a] + 1) / (n * (n + 1))
    return w


def _check(rank: int, shape_mesh: tuple[int, ...], n_cases: int, seed: int) -> int:
    from cost_models.redistribution import backward_steps, plan_redistribution
    from layers3d import CommCounter, DeviceMesh, redistribute, shard_tensor

    mesh = Mesh(shape_mesh)
    dm = DeviceMesh(mesh)
    gen = torch.Generator().manual_seed(seed)
    n_collectives = 0
    for i, (shape, src, dst) in enumerate(_cases(mesh, n_cases, seed)):
        full = torch.randn(shape, generator=gen, dtype=torch.float64)
        grad = torch.randn(shape, generator=gen, dtype=torch.float64)
        x = (shard_tensor(full, src, mesh, rank) * _weights(src, mesh, rank)).requires_grad_()
        with CommCounter() as cc:
            y = redistribute(x, src, dst, dm, shape)
            y.backward(shard_tensor(grad, dst, mesh, rank))
        want = shard_tensor(full, dst, mesh, rank) * _weights(dst, mesh, rank)
        where = f"case {i}: {shape} {src} -> {dst}"
        assert torch.allclose(y, want, rtol=1e-12, atol=1e-12), where
        assert torch.allclose(x.grad, shard_tensor(grad, src, mesh, rank), rtol=1e-12, atol=1e-12), where
        fwd = plan_redistribution(shape, 8, src, dst, mesh)
        bwd = backward_steps(fwd, shape, 8, mesh)
        predicted = [Collective(s.kind, s.axes, s.bytes, phase, "edge")
                     for phase, steps in (("forward", fwd), ("backward", bwd)) for s in steps if s.is_collective]
        assert cc.records == predicted, (where, cc.records, predicted)
        n_collectives += len(predicted)
    return n_collectives


@pytest.mark.parametrize("shape_mesh, seed", [((2, 2, 2), 0), ((8,), 1)])
def test_random_layouts_match_dense_slicing(shape_mesh: tuple[int, ...], seed: int) -> None:
    counts = run_ranks(_check, 8, 120, args=(shape_mesh, 120, seed))
    assert len(set(counts)) == 1 and counts[0] > 100  # the random cases do move data
