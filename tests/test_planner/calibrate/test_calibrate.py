"""`planner calibrate`: group selection, the profile it writes, a real run on gloo ranks, argument errors."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT as REPO_ROOT

from cost_models.comm import collective_seconds
from cost_models.hardware import ProfileError, load_profile
from cost_models.mesh import Mesh, candidate_meshes
from cost_models.strategy import Collective
from planner.calibrate.config import CalibrateConfig, CalibrateError
from planner.calibrate.fit import Sample, predict_seconds
from planner.calibrate.measure import Series, axis_groups
from planner.calibrate.run import Calibration, build_profile, fit_calibration
from planner.cli.app import main as cli_main

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")
ROOT = REPO_ROOT


# --- which groups are timed ------------------------------------------------------------------------
def test_one_group_per_link_and_size_by_default() -> None:
    groups = axis_groups(candidate_meshes(8))  # (8,) and (2,2,2) on one node of 8
    assert [(g.link, g.n, g.axes, str(g.mesh)) for g in groups] == [
        ("intra", 8, ("x",), "8(x)"), ("intra", 2, ("x",), "2x2x2(x,y,z)"), ("intra", 4, ("x", "y"), "2x2x2(x,y,z)")]
    for g in groups:  # each partitions the world into equal groups
        assert sorted(r for grp in g.groups for r in grp) == list(range(8))
        assert all(len(grp) == g.n for grp in g.groups)


def test_every_group_lists_each_distinct_partition_once() -> None:
    groups = axis_groups(candidate_meshes(8), every=True)
    # x, y, z, xy, xz, yz of 2x2x2 plus the flat axis (xyz of 2x2x2 is the same partition as (8,)).
    assert sorted((len(g.axes), g.n) for g in groups) == [(1, 2), (1, 2), (1, 2), (1, 8), (2, 4), (2, 4), (2, 4)]
    assert len({frozenset(g.groups) for g in groups}) == len(groups)


def test_groups_that_cross_nodes_are_inter() -> None:
    mesh = Mesh((2, 2, 2), ranks_per_node=4)  # x pairs rank r with r + 4: another node
    by_axes = {g.axes: g.link for g in axis_groups([mesh], every=True)}
    assert by_axes[("x",)] == "inter" and by_axes[("y",)] == "intra" and by_axes[("y", "z")] == "intra"
    assert by_axes[("x", "y")] == "inter"


# --- fits and the profile ---------------------------------------------------------------------------
# Synthetic truth: each (link, group size, kind) has its own alpha and beta.
TRUTH = {(n, kind): (1e-4 * (1 + i) * n, 1e-9 * (1 + j) / n)
         for i, n in enumerate((2, 4, 8)) for j, kind in enumerate(KINDS)}


def _synthetic_calibration() -> Calibration:
    cal = Calibration(8, 8, "cpu", "cpu", "gloo", matmul_flops={"fp32": 12e9, "bf16": 40e9}, matmul_size=512,
                      copy_bandwidth=4e9, seconds=1.0)
    for g in axis_groups(candidate_meshes(8)):
        for kind in KINDS:
            alpha, beta = TRUTH[(g.n, kind)]
            samples = [Sample(kind, g.n, b, predict_seconds(kind, g.n, b, alpha, beta, "binomial"))
                       for b in (4096 * 4**i for i in range(7))]
            cal.series.append(Series(g, kind, samples, "max bytes"))
    return cal


def test_profile_prices_each_measured_collective_exactly(tmp_path: Path) -> None:
    cal = _synthetic_calibration()
    fits, rows = fit_calibration(cal)
    profile = build_profile(load_profile("cpu-gloo"), cal, fits)
    path = tmp_path / "p.json"
    profile.save(path)
    loaded = load_profile(str(path))
    assert loaded == profile and loaded.name == "cpu-gloo-calibrated"
    assert loaded.broadcast_algorithm == "binomial"  # gloo's, the one the broadcasts were fitted with
    # What the planner charges for a collective of a measured group size is exactly the measured time.
    flat, cube = candidate_meshes(8)
    for mesh, axes in ((flat, ("x",)), (cube, ("z",)), (cube, ("y", "z"))):
        n = mesh.size(axes)
        for kind in KINDS:
            c = Collective(kind, axes, 3 * 2**20, "forward")
            want = predict_seconds(kind, n, c.bytes, *TRUTH[(n, kind)], "binomial")
            assert math.isclose(collective_seconds(c, mesh, loaded), want, rel_tol=1e-9)
    per_size = [fit for label, _, fit, _ in rows if " n=" in label]
    assert len(per_size) == 15 and all(f is not None and f.r2 > 1 - 1e-9 for f in per_size)
    # A group size not timed (16 ranks, e.g. a plan for a bigger node) is priced with the largest timed size's fit.
    fits = fit_calibration(cal)[0]
    for kind in KINDS:
        assert fits[("intra", kind)] == fits[("intra", kind, 8)]
        assert loaded.alpha_beta("intra", kind, 16) == pytest.approx(TRUTH[(8, kind)], rel=1e-9)


def test_profile_takes_measured_compute_and_keeps_the_rest() -> None:
    base = load_profile("a100-80gb")
    cal = _synthetic_calibration()
    profile = build_profile(base, cal, fit_calibration(cal)[0])
    assert profile.efficiency == 1.0
    assert profile.peak("float32") == 12e9 and profile.peak("bfloat16") == 40e9
    assert profile.peak("float16") == base.peak("float16")  # not measured: same achievable rate as the base
    assert profile.mem_bandwidth == 4e9 and profile.device == "cpu"
    assert (profile.inter_alpha, profile.inter_beta) == (base.inter_alpha, base.inter_beta)  # no inter link here
    assert "measured by planner calibrate" in profile.source and base.source in profile.source
    # Per (link, kind) fits exist for group sizes that were not timed (e.g. 16 on another mesh).
    assert set(profile.overrides) == {("intra", k) for k in KINDS}
    assert set(profile.group_overrides) == {("intra", k, n) for k in KINDS for n in (2, 4, 8)}


def test_group_overrides_win_for_their_size_only(tmp_path: Path) -> None:
    # The small addition to cost_models.hardware that calibrate needs: (link, kind, group size) overrides.
    data = load_profile("a100-80gb").to_json()
    data["overrides"] = {"intra:all_gather": [2e-6, 1e-11]}
    data["group_overrides"] = {"intra:all_gather:8": [5e-6, 3e-11]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    p = load_profile(str(path))
    assert p.alpha_beta("intra", "all_gather", 8) == (5e-6, 3e-11)
    assert p.alpha_beta("intra", "all_gather", 4) == (2e-6, 1e-11)  # other sizes: the per-kind override
    assert p.alpha_beta("intra", "all_gather") == (2e-6, 1e-11)
    assert p.alpha_beta("inter", "all_gather", 8) == (p.inter_alpha, p.inter_beta)
    assert p.to_json() == data
    assert "group_overrides" not in load_profile("a100-80gb").to_json()  # absent when empty: old JSON unchanged


@pytest.mark.parametrize(("key", "value", "message"), [
    ("intra:all_gather:eight", [1e-6, 1e-9], "<link>:<kind>:<group size>"),
    ("intra:all_gather:1", [1e-6, 1e-9], "group size >= 2"),
    ("intra:gossip:8", [1e-6, 1e-9], "kind in"),
    ("intra:all_gather:8", [1e-6, 0.0], "beta of intra:all_gather:8"),
    ("intra:all_gather:8", [1e-6], r"\[alpha, beta\]"),
])
def test_bad_group_overrides_are_profile_errors(key: str, value: list, message: str) -> None:
    from cost_models.hardware import HardwareProfile

    data = load_profile("cpu-gloo").to_json()
    data["group_overrides"] = {key: value}
    with pytest.raises(ProfileError, match=message):
        HardwareProfile.from_json(data)


# --- a real run on forked gloo ranks -----------------------------------------------------------------
def _calibrate_rank(rank: int, out: str, samples: str) -> dict:
    from planner.calibrate.run import run

    config = CalibrateConfig(min_bytes=4096, max_bytes=2**20, growth=4, warmup=1, reps=2, passes=2,
                             time_budget_s=4.0, timeout_s=30.0, base="cpu-gloo", compute_seconds=0.05)
    with open(os.devnull, "w") as sink:
        return run(config, out, samples_out=samples, echo=sink).to_json()


@pytest.mark.distributed
def test_real_calibration_on_four_gloo_ranks(tmp_path: Path) -> None:
    from tests.distributed import run_ranks

    out, samples = tmp_path / "p.json", tmp_path / "samples.csv"
    results = run_ranks(_calibrate_rank, world_size=4, timeout_s=120, args=(str(out), str(samples)))
    assert all(r == results[0] for r in results)  # every rank computed the same profile
    profile = load_profile(str(out))
    assert profile.to_json() == results[0]
    # candidate meshes of 4: (4,) and (2,2): groups of 4 and of 2, all on one node; every collective timed
    # on each at >= 3 sizes (the fits are not asserted: tiny messages on 2 busy cores are mostly noise).
    with open(samples) as f:
        rows = list(csv.DictReader(f))
    sizes: dict[tuple[str, str, str], set[str]] = {}
    for row in rows:
        sizes.setdefault((row["link"], row["n"], row["kind"]), set()).add(row["bytes"])
    assert set(sizes) == {("intra", n, k) for n in ("2", "4") for k in KINDS}
    assert all(len(v) >= 3 for v in sizes.values())
    assert {(link, n) for link, _, n in profile.group_overrides} <= {("intra", 2), ("intra", 4)}
    assert {link for link, _ in profile.overrides} <= {"intra"} and profile.group_overrides
    assert profile.peak("float32") > 0 and profile.mem_bandwidth > 0 and profile.efficiency == 1.0


def _retry_rank(rank: int) -> list[tuple[str, int, int]]:
    import torch

    from planner.calibrate.measure import time_series

    # Rank 1 alone finds the all-reduce fit poor (twice) and rank 0 alone the broadcast fit (always): every
    # rank must re-time exactly those, or the ranks would run different collectives and hang.
    def needs_more(s: Series) -> bool:
        if s.kind == "all_reduce":
            return rank == 1 and s.retries < 2
        return s.kind == "broadcast" and rank == 0

    series, _ = time_series(axis_groups(candidate_meshes(2)), ("all_gather", "all_reduce", "broadcast"),
                            min_bytes=4096, max_bytes=16384, growth=2, warmup=1, reps=1, passes=1, budget_s=0.5,
                            timeout_s=30.0, device=torch.device("cpu"), needs_more=needs_more, retry_budget_s=60.0)
    return [(s.kind, s.retries, len(s.samples)) for s in series]


@pytest.mark.distributed
def test_series_with_a_poor_fit_on_any_rank_are_timed_again_on_every_rank() -> None:
    from planner.calibrate.measure import MAX_RETRIES
    from tests.distributed import run_ranks

    results = run_ranks(_retry_rank, world_size=2, timeout_s=60)
    assert results[0] == results[1]
    assert results[0] == [("all_gather", 0, 3), ("all_reduce", 2, 3), ("broadcast", MAX_RETRIES, 3)]


def _stalled_rank(rank: int, out: str) -> None:
    import time

    import planner.calibrate.measure as measure
    from planner.calibrate.run import run

    if rank == 3:  # this rank stops taking part as soon as the first collective is timed
        measure._collective = lambda *args, **kwargs: (lambda: time.sleep(60))  # type: ignore[assignment]
    config = CalibrateConfig(min_bytes=4096, max_bytes=16 * 1024, reps=1, passes=1, timeout_s=3.0,
                             base="cpu-gloo", compute_seconds=0.05)
    run(config, out)


@pytest.mark.distributed
def test_a_stalled_rank_fails_the_others_within_the_timeout(tmp_path: Path) -> None:

    from tests.distributed import RankError, RankTimeout, run_ranks

    with pytest.raises(RankError) as info:
        run_ranks(_stalled_rank, world_size=4, timeout_s=120, args=(str(tmp_path / "p.json"),))
    assert not isinstance(info.value, RankTimeout)  # the 3 s collective timeout fired, not the harness's
    assert "timed out" in str(info.value).lower() or "timeout" in str(info.value).lower()
    assert not (tmp_path / "p.json").exists()


# --- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "message"), [
    (["--out", "/no/such/dir/p.json"], "does not exist"),
    (["--max-bytes", "1KiB"], "smaller than --min-bytes"),
    (["--max-bytes", "lots"], "--min-bytes/--max-bytes"),
    (["--growth", "1"], "--growth"),
    (["--time-budget", "0"], "--time-budget"),
    (["--compute-seconds", "-1"], "--compute-seconds"),
    (["--reps", "2", "--passes", "3"], "--passes"),
    (["--kinds", "all_gather,gossip"], "gossip"),
    (["--base", "tpu-v9"], "unknown hardware profile"),
])
def test_bad_arguments_are_one_line_errors(argv: list[str], message: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    if "--out" not in argv:
        argv = ["--out", str(tmp_path / "p.json"), *argv]
    assert cli_main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "p.json").exists()


def test_config_errors_are_value_errors() -> None:
    with pytest.raises(CalibrateError, match="min-bytes"):
        CalibrateConfig(min_bytes=2)
    with pytest.raises(CalibrateError, match="integer"):
        CalibrateConfig(growth=2.5)  # type: ignore[arg-type]
    with pytest.raises(CalibrateError, match="meshes"):
        CalibrateConfig(meshes=())
    assert issubclass(CalibrateError, ValueError) and issubclass(ProfileError, ValueError)


def test_module_runs_alone_as_one_rank(tmp_path: Path) -> None:
    # Without torchrun: one rank, no collective to time; compute and memory are still measured.
    out = tmp_path / "p.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-m", "planner.cli.calibrate", "--out", str(out), "--base", "cpu-gloo",
                           "--compute-seconds", "0.05"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["name"] == "cpu-gloo-calibrated" and data["efficiency"] == 1.0
    assert "group_overrides" not in data and data["overrides"] == {}
    assert "no collective timed" in proc.stdout and "wrote profile" in proc.stdout
