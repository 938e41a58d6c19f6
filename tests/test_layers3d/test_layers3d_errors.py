"""User errors are named exceptions that say what is wrong and how to fix it; a failing rank stops every
rank (never a hang); meta-device models are built shard by shard with replicas that agree."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from cost_models.linear_scheme import LinearScheme, LinearSchemeError, linear_plan
from cost_models.mesh import Mesh
from layers3d import MeshSetupError, ShardingError
from tests.distributed import RankError, RankTimeout, run_ranks

CUBE = Mesh((2, 2, 2))


# --- pure checks (no process group) -------------------------------------------------------------------
@pytest.mark.parametrize("scheme, words", [
    (LinearScheme("4d"), ["unknown linear scheme", "3d_allreduce"]),
    (LinearScheme("3d", ("x", "y")), ["3d needs 3 role axes"]),
    (LinearScheme("1d_col"), ["one or more tensor-parallel axes"]),
    (LinearScheme("2d", ("x", "y"), dp=("y",)), ["distinct mesh axes"]),
    (LinearScheme("2d", ("x", "q")), ["unknown mesh axis 'q'"]),
    (LinearScheme("2d", ("x", "y"), sp=True), ["sp (sequence parallelism) applies to 1d_col/1d_row"]),
    (LinearScheme("1d_row", ("x",), save_input="shard"), ["save_input='shard'", "gathers its input"]),
    (LinearScheme("3d", ("x", "y", "z"), weight_shard=True), ["weight_shard applies to 3d_allreduce only"]),
])
def test_bad_schemes_are_named_errors(scheme: LinearScheme, words: list[str]) -> None:
    with pytest.raises(LinearSchemeError) as e:
        scheme.resolve(CUBE)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("scheme, k, n, inter, words", [
    (LinearScheme("3d", ("x", "y", "z")), 10, 6, 1, ["3d[roles=xyz]: in_features 10 not divisible by 4 (axis zx)",
                                                     "choose sizes divisible"]),
    (LinearScheme("1d_col", ("x", "y", "z")), 8, 12, 1, ["1d_col[T=xyz]: out_features 12 not divisible by 8"]),
    (LinearScheme("1d_col", ("y", "z")), 8, 4, 2, ["out_features 4 in 2 segments not divisible by 8 (axis yz)"]),
    (LinearScheme("2d", ("x", "y")), 6, 5, 1, ["2d[roles=xy]: out_features 5 not divisible by 2 (axis y)"]),
])
def test_weights_the_mesh_does_not_divide_are_named(scheme: LinearScheme, k: int, n: int, inter: int,
                                                    words: list[str]) -> None:
    with pytest.raises(LinearSchemeError) as e:
        linear_plan(scheme, (64, k), n, CUBE, inter)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert str(e.value).count(":") <= 3, "only the reasons of the scheme asked for are listed"


def test_token_dims_that_do_not_divide_are_named() -> None:
    with pytest.raises(LinearSchemeError, match=r"3d\[roles=xyz\]: tokens \(3, 5\) cannot be split over axes xy"):
        linear_plan(LinearScheme("3d", ("x", "y", "z")), (3, 5, 8), 8, CUBE)


def test_device_mesh_needs_a_process_group() -> None:
    from layers3d import DeviceMesh
    with pytest.raises(MeshSetupError, match="init_process_group"):
        DeviceMesh(CUBE)


# --- on 8 ranks --------------------------------------------------------------------------------------------
def _errors_on_ranks(rank: int) -> dict[str, str]:
    from cost_models.layout import Layout
    from layers3d import DeviceMesh, ParallelEmbedding, ParallelLayerNorm, ParallelLinear, redistribute

    out: dict[str, str] = {}

    def catch(key: str, fn) -> None:  # noqa: ANN001
        try:
            fn()
        except (ShardingError, MeshSetupError) as e:
            out[key] = f"{type(e).__name__}: {e}"

    catch("mesh", lambda: DeviceMesh(Mesh((2, 2))))
    dm = DeviceMesh(CUBE)
    catch("linear", lambda: ParallelLinear(10, 6, dm, LinearScheme("3d", ("x", "y", "z"))))
    catch("embedding", lambda: ParallelEmbedding(10, 8, dm, "vocab", axes=("x", "y")))
    catch("norm", lambda: ParallelLayerNorm(6, dm, features=("x", "y")))
    layer = ParallelLinear(8, 8, dm, LinearScheme("3d", ("x", "y", "z")), token_shape=(4, 3))
    catch("forward", lambda: layer(torch.zeros(2, 3, 4)))
    catch("redistribute", lambda: redistribute(torch.zeros(3, 4), Layout((("x",), ())), Layout(((), ())), dm, (8, 4)))
    return out


@pytest.mark.distributed
def test_layer_errors_on_ranks_name_dim_axes_and_fix() -> None:
    res = run_ranks(_errors_on_ranks, 8, 60)[0]
    assert res["mesh"].startswith("MeshSetupError") and "process group has 8" in res["mesh"]
    assert res["linear"].startswith("ShardingError") and "in_features 10 not divisible by 4 (axis zx)" in res["linear"]
    assert "embedding 10x8" in res["embedding"] and "vocabulary 10 not divisible by 4 (axis xy)" in res["embedding"]
    assert "choose sizes divisible" in res["embedding"]
    assert "layer norm feature dim has size 6" in res["norm"]
    assert "local shape (1, 3, 4), got (2, 3, 4)" in res["forward"] and "token_shape=" in res["forward"]
    assert "not the [x, -] block (4, 4)" in res["redistribute"]


# --- the harness: results, failures and hangs ---------------------------------------------------------------
def _raise_on_rank_3(rank: int) -> None:
    import torch.distributed as dist

    if rank == 3:
        raise ShardingError("rank 3 found a bad shape")
    dist.all_reduce(torch.ones(1))  # the others wait for rank 3, which never comes


def _hang(rank: int) -> None:
    if rank == 5:
        time.sleep(3600)


@pytest.mark.distributed
def test_results_come_back_from_every_rank() -> None:
    res = run_ranks(lambda rank: {"rank": rank, "t": torch.full((2,), float(rank))}, 8, 30)
    assert [r["rank"] for r in res] == list(range(8)) and torch.equal(res[7]["t"], torch.full((2,), 7.0))


@pytest.mark.distributed
def test_a_rank_that_raises_stops_every_rank_with_its_error() -> None:
    with pytest.raises(RankError) as e:
        run_ranks(_raise_on_rank_3, 8, 30)
    assert not isinstance(e.value, RankTimeout)  # the others were stopped, not left to the harness's timeout
    assert isinstance(e.value.first, ShardingError)
    assert next(iter(e.value.errors)) == 3  # the root cause first
    assert "rank 3 found a bad shape" in str(e.value) and "_raise_on_rank_3" in str(e.value)


@pytest.mark.distributed
def test_a_taken_port_is_retried_with_another(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    import tests.distributed as harness

    real_free_port = harness._free_port
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        used: list[int] = []

        def ports() -> int:  # the taken port first, then free ones (a loaded machine may need a third try)
            used.append(taken if not used else real_free_port())
            return used[-1]

        monkeypatch.setattr(harness, "_free_port", ports)
        # the taken port spends one attempt by design: the others keep the harness's usual number for gloo's own
        # loopback failures under load (a clean-clone CI run lost both of its two left to "Connection closed by peer")
        monkeypatch.setattr(harness, "_ATTEMPTS", harness._ATTEMPTS + 1)
        assert run_ranks(lambda rank: rank, 8, 30) == list(range(8))
    assert used[0] == taken and len(used) >= 2  # the rendezvous on the taken port failed, a later one worked


def _lose_connection_once(rank: int, log: str, words: str) -> int:
    import torch.distributed as dist

    if rank == 0:
        with open(log, "a") as f:
            f.write("attempt\n")
        with open(log) as f:
            first = len(f.read().splitlines()) == 1
        if first:  # what gloo raises when a peer's socket closes under it (seen once in CI in dist.new_group)
            raise RuntimeError(words)
    dist.barrier()
    return rank


@pytest.mark.distributed
def test_a_lost_gloo_connection_is_retried_but_a_tests_own_error_is_not(tmp_path: Path) -> None:
    lost = ("Gloo connectFullMesh failed with [pair.cc:553] Connection closed by peer [127.0.0.1]:17042. "
            "This is typically caused by a remote worker crashing.")
    assert run_ranks(_lose_connection_once, 4, 30, args=(str(tmp_path / "a.log"), lost)) == [0, 1, 2, 3]
    assert (tmp_path / "a.log").read_text().splitlines() == ["attempt"] * 2  # one failed attempt, one good
    with pytest.raises(RankError, match="the test's own words"):
        run_ranks(_lose_connection_once, 4, 30, args=(str(tmp_path / "b.log"), "the test's own words"))
    assert (tmp_path / "b.log").read_text().splitlines() == ["attempt"]  # raised as it was, not retried


@pytest.mark.distributed
def test_a_hang_is_killed_at_the_timeout() -> None:
    with pytest.raises(RankTimeout, match=r"ranks \[5\] still running after 3 s"):
        run_ranks(_hang, 8, 3)


# --- meta-device construction ----------------------------------------------------------------------------------
def _meta_build(rank: int) -> dict:
    from layers3d import DeviceMesh, ParallelEmbedding, ParallelLayerNorm, ParallelLinear

    dm = DeviceMesh(CUBE)
    with torch.device("meta"):
        lin, ln, emb = torch.nn.Linear(16, 24), torch.nn.LayerNorm(16), torch.nn.Embedding(32, 16)
    gen = torch.Generator().manual_seed(5)
    layers = {
        "lin3d": ParallelLinear.from_dense(lin, dm, LinearScheme("3d", ("x", "y", "z")), generator=gen),
        "lin1d": ParallelLinear.from_dense(lin, dm, LinearScheme("1d_col", ("z",)), interleave=3, generator=gen),
        "ln": ParallelLayerNorm.from_dense(ln, dm, features=("y",), tokens=("x", "z")),
        "emb": ParallelEmbedding.from_dense(emb, dm, "vocab", axes=("y", "z"), generator=gen),
    }
    return {name: ({k: v.detach().clone() for k, v in m.named_parameters()}, m.dense_state_dict())
            for name, m in layers.items()}


@pytest.mark.distributed
def test_meta_models_are_initialised_shard_by_shard() -> None:
    from layers3d.shard import block_index

    res = run_ranks(_meta_build, 8, 60)
    shapes = {"lin3d": {"weight": (12, 4), "bias": (12,)}, "lin1d": {"weight": (12, 16), "bias": (12,)},
              "ln": {"weight": (8,), "bias": (8,)}, "emb": {"weight": (8, 16)}}
    dense = {"lin3d": {"weight": (24, 16), "bias": (24,)}, "lin1d": {"weight": (24, 16), "bias": (24,)},
             "ln": {"weight": (16,), "bias": (16,)}, "emb": {"weight": (32, 16)}}
    for name, want in shapes.items():
        for local, full in (r[name] for r in res):
            assert {k: tuple(v.shape) for k, v in local.items()} == want
            assert {k: tuple(v.shape) for k, v in full.items()} == dense[name]
            assert torch.equal(full["weight"], res[0][name][1]["weight"])  # every rank gathers the same table
    # 1d_col over z: ranks with the same z coordinate hold the same block (replicas agree), the two blocks differ
    by_block: dict[int, torch.Tensor] = {}
    for rank, r in enumerate(res):
        w = r["lin1d"][0]["weight"]
        b = block_index(("z",), CUBE, rank)
        assert torch.equal(by_block.setdefault(b, w), w)
    assert not torch.equal(by_block[0], by_block[1])
    assert float(by_block[0].std()) == pytest.approx(0.02, rel=0.3)   # default init: N(0, 0.02)
    assert torch.equal(res[0]["ln"][1]["weight"], torch.ones(16)) and torch.equal(res[0]["lin3d"][1]["bias"],
                                                                                  torch.zeros(24))


def test_rendezvous_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    """The harness's and the launch tests' store ports (`tests/ports.py`): none handed out twice in a round
    through this worker's slice, each one free when handed out, none where the kernel picks ports for
    bind(0) and outgoing connections (the race behind a hung guard test)."""
    import socket

    from ports import free_port

    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(20_000 <= p < 32_000 for p in ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
