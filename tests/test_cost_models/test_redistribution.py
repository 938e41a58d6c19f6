"""plan_redistribution is checked by simulating its steps on every rank with numpy.

The simulator knows only what each collective means (gather blocks in group order, sum, slice), so a
wrong plan (bad order, wrong axes, lost interleave) shows up as wrong local blocks.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from cost_models.layout import Layout, LayoutError
from cost_models.mesh import Mesh
from cost_models.redistribution import backward_steps, plan_redistribution


def _block_index(mesh: Mesh, rank: int, axes: tuple[str, ...]) -> int:
    c = mesh.coords(rank)
    idx = 0
    for a in axes:
        idx = idx * mesh.axis_size(a) + c[a]
    return idx


def _take(x: np.ndarray, dim: int, parts: int, idx: int, interleave: int) -> np.ndarray:
    """Block `idx` of `parts` along `dim`, per segment when interleaved."""
    segs = np.split(x, interleave, axis=dim)
    return np.concatenate([np.split(s, parts, axis=dim)[idx] for s in segs], axis=dim)


def local_block(full: np.ndarray, layout: Layout, mesh: Mesh, rank: int) -> np.ndarray:
    out = full
    for d, axes in enumerate(layout.dims):
        if axes:
            inter = layout.interleave if d == full.ndim - 1 else 1
            out = _take(out, d, mesh.size(axes), _block_index(mesh, rank, axes), inter)
    return out


def _group(mesh: Mesh, rank: int, axes: tuple[str, ...]) -> list[int]:
    return next(g for g in mesh.groups(axes) if rank in g)


def simulate(locals_: list[np.ndarray], steps, mesh: Mesh) -> list[np.ndarray]:
    cur = list(locals_)
    for s in steps:
        new = []
        for r in range(mesh.world_size):
            g = _group(mesh, r, s.axes)
            last = cur[r].ndim - 1
            if s.kind == "all_gather":
                inter = s.interleave if s.dim == last else 1
                segs = [np.split(cur[m], inter, axis=s.dim) for m in g]
                new.append(np.concatenate([np.concatenate([sg[i] for sg in segs], axis=s.dim)
                                           for i in range(inter)], axis=s.dim))
            elif s.kind == "slice":
                inter = s.interleave if s.dim == last else 1
                new.append(_take(cur[r], s.dim, len(g), g.index(r), inter))
            elif s.kind == "all_reduce":
                new.append(sum(cur[m] for m in g))
            elif s.kind == "reduce_scatter":
                new.append(_take(sum(cur[m] for m in g), s.dim, len(g), g.index(r), 1))
            elif s.kind == "all_to_all":
                gathered = np.concatenate([cur[m] for m in g], axis=s.dim)
                new.append(_take(gathered, s.dst_dim, len(g), g.index(r), 1))
            else:
                raise AssertionError(s.kind)
        cur = new
    return cur


def _random_layout(rng: random.Random, ndim: int, mesh: Mesh, partial_ok: bool) -> Layout:
    axes = list(mesh.axis_names)
    rng.shuffle(axes)
    dims: list[list[str]] = [[] for _ in range(ndim)]
    partial = []
    for a in axes:
        r = rng.random()
        if r < 0.25:
            continue
        if partial_ok and r < 0.35:
            partial.append(a)
        else:
            dims[rng.randrange(ndim)].append(a)
    return Layout(tuple(tuple(d) for d in dims), tuple(partial))


@pytest.mark.parametrize("shape", [(2, 2, 2), (2, 4), (8,)])
def test_random_conversions_match_simulation(shape):
    mesh = Mesh(shape)
    rng = random.Random(sum(shape))
    full_shape = (8, 8, 24)
    for _ in range(60):
        src = _random_layout(rng, 3, mesh, partial_ok=True)
        dst = _random_layout(rng, 3, mesh, partial_ok=False)
        full = np.random.default_rng(0).standard_normal(full_shape)
        # Partial sums: rank r's local tensor is a random share; the shares of a group add up to the block.
        locals_ = []
        for r in range(mesh.world_size):
            blk = local_block(full, src.without_partial(), mesh, r)
            if src.partial:
                g = _group(mesh, r, src.partial)
                shares = np.random.default_rng(g[0]).standard_normal((len(g),) + blk.shape)
                shares[-1] = blk - shares[:-1].sum(axis=0)
                blk = shares[g.index(r)]
            locals_.append(blk)
        steps = plan_redistribution(full_shape, 8, src, dst, mesh)
        got = simulate(locals_, steps, mesh)
        for r in range(mesh.world_size):
            np.testing.assert_allclose(got[r], local_block(full, dst, mesh, r), atol=1e-12,
                                       err_msg=f"{src} -> {dst} rank {r}: {[str(s) for s in steps]}")


def test_backward_steps_invert_forward_layouts():
    mesh = Mesh((2, 2, 2))
    rng = random.Random(7)
    full = np.random.default_rng(1).standard_normal((8, 8, 16))
    for _ in range(40):
        src = _random_layout(rng, 3, mesh, partial_ok=False)
        dst = _random_layout(rng, 3, mesh, partial_ok=False)
        bw = backward_steps(plan_redistribution(full.shape, 4, src, dst, mesh), full.shape, 4, mesh)
        # A complete gradient laid out like dst comes back complete and laid out like src.
        got = simulate([local_block(full, dst, mesh, r) for r in range(8)], bw, mesh)
        for r in range(8):
            np.testing.assert_allclose(got[r], local_block(full, src, mesh, r))


def test_interleaved_fused_projection_gathers_per_segment():
    mesh = Mesh((2, 2, 2))
    full = np.arange(2 * 48, dtype=float).reshape(2, 48)
    src = Layout(((), ("x", "z")), interleave=3)
    dst = Layout(((), ()))
    steps = plan_redistribution(full.shape, 4, src, dst, mesh)
    assert [s.kind for s in steps] == ["all_gather"]
    got = simulate([local_block(full, src, mesh, r) for r in range(8)], steps, mesh)
    for r in range(8):
        np.testing.assert_array_equal(got[r], full)
    # Each rank's local block holds its piece of each of the three segments (q, k, v).
    blk = local_block(full, src, mesh, 0)
    assert blk.shape == (2, 12) and list(blk[0, :4]) == [0, 1, 2, 3] and blk[0, 4] == 16


def test_bytes_follow_the_convention():
    mesh = Mesh((2, 2, 2))
    shape = (8, 16, 32)
    src = Layout((("z", "x"), (), ("y",)))
    steps = plan_redistribution(shape, 2, src, Layout.replicated(3), mesh)
    # all-gather bytes = the gathered output per rank.
    assert [(s.kind, s.axes, s.bytes) for s in steps] == [
        ("all_gather", ("z", "x"), 8 * 16 * 16 * 2),
        ("all_gather", ("y",), 8 * 16 * 32 * 2),
    ]
    a2a = plan_redistribution(shape, 4, Layout(((), ("x",), ())), Layout(((), (), ("x",))), mesh)
    assert [(s.kind, s.bytes) for s in a2a] == [("all_to_all", 8 * 8 * 32 * 4)]
    assert plan_redistribution(shape, 4, src, src, mesh) == []


def test_invalid_layouts_are_errors():
    mesh = Mesh((2, 2, 2))
    with pytest.raises(LayoutError, match="cannot be split"):
        plan_redistribution((3, 4), 4, Layout((("x",), ())), Layout.replicated(2), mesh)
    with pytest.raises(LayoutError, match="partial"):
        plan_redistribution((4, 4), 4, Layout.replicated(2), Layout(((), ()), ("x",)), mesh)
    with pytest.raises(LayoutError, match="twice"):
        Layout((("x",), ("x",)))


def test_mesh_groups_cover_every_rank_once():
    for shape in [(2, 2, 2), (2, 4), (4, 4, 4)]:
        mesh = Mesh(shape)
        for k in range(1, len(shape) + 1):
            for axes in itertools.permutations(mesh.axis_names, k):
                groups = mesh.groups(axes)
                flat = sorted(r for g in groups for r in g)
                assert flat == list(range(mesh.world_size))
                assert all(len(g) == mesh.size(axes) for g in groups)
