"""RankGuard: a rank that raises or dies makes every rank exit non-zero within seconds, naming the failing
rank. Three plain processes (no torchrun, so the guard alone must stop them) run gloo all-reduces; the
normal finish is exercised by the verify command's own tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from paths import ROOT as REPO_ROOT
from ports import free_port

pytestmark = pytest.mark.distributed

ROOT = str(REPO_ROOT)
WORKER = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    from layers3d.inflight import tracked
    from planner.verify.guard import RankGuard, init_distributed

    ctx = init_distributed(timeout_s=120)
    mode = sys.argv[1]
    with RankGuard(ctx.guard_store, ctx.rank, ctx.world_size, poll_s=0.2, dead_after_s=5, deadline_s=3):
        t = torch.ones(4)
        with tracked("all_reduce", (), "first"):
            dist.all_reduce(t)
        if ctx.rank == 2 and mode == "stuck":  # runs another program: never joins the second all-reduce
            time.sleep(600)
        if ctx.rank == 2 and mode == "raise":
            raise RuntimeError("rank two fails on purpose")
        if ctx.rank == 2 and mode == "die":
            os._exit(9)
        if ctx.rank == 2 and mode == "user":
            from planner.units import BudgetError
            raise BudgetError("a user error on rank two")
        if ctx.rank == 2 and mode == "bug":
            raise ValueError("a bug on rank two")
        if mode == "calibrate":  # planner calibrate's own collectives are tracked too
            from planner.calibrate.measure import world_max
            if ctx.rank == 2:
                time.sleep(600)
            world_max([1.0], torch.device("cpu"))
        with tracked("all_reduce", (), "second"):
            dist.all_reduce(t)
        print("done", ctx.rank, t.tolist(), flush=True)
""")


def _run(tmp_path: Path, mode: str, world: int = 3) -> tuple[list[int], list[str], float]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    procs = []
    start = time.monotonic()
    for r in range(world):
        env = {**os.environ, "PYTHONPATH": ROOT, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script), mode], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs, codes = [], []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        outs.append(out)
        codes.append(p.returncode)
    return codes, outs, time.monotonic() - start


def test_a_raising_rank_stops_every_rank_with_its_message(tmp_path: Path) -> None:
    codes, outs, seconds = _run(tmp_path, "raise")
    assert all(c != 0 for c in codes), codes
    assert "rank two fails on purpose" in outs[2]
    for r in (0, 1):
        assert "rank 2" in outs[r] and "rank two fails on purpose" in outs[r], outs[r]
        assert "done" not in outs[r]


def test_a_dying_rank_is_named_by_the_others(tmp_path: Path) -> None:
    codes, outs, seconds = _run(tmp_path, "die")
    assert codes[2] == 9 and all(c != 0 for c in codes), codes
    for r in (0, 1):
        assert "rank 2 stopped responding" in outs[r], outs[r]


def test_a_user_error_is_one_line_with_exit_status_2(tmp_path: Path) -> None:
    codes, outs, _ = _run(tmp_path, "user")
    assert codes == [2, 2, 2], codes  # every rank exits with the status of the run's first failure
    assert "error: BudgetError: a user error on rank two" in outs[2]
    assert "Traceback" not in outs[2]


def test_a_bug_is_one_internal_error_line_without_debug(tmp_path: Path) -> None:
    """A ValueError that is not a PlannerError is a bug of the planner, not a user error: one line that says
    so (exit 1 on every rank), and no traceback unless --debug."""
    codes, outs, _ = _run(tmp_path, "bug")
    assert all(c == 1 for c in codes), codes
    assert "internal error, please report it" in outs[2] and "ValueError: a bug on rank two" in outs[2]
    assert "Traceback" not in outs[2]
    for r in (0, 1):
        assert "rank 2" in outs[r] and "a bug on rank two" in outs[r], outs[r]


def test_a_rank_waiting_past_the_deadline_names_the_collective_and_the_missing_peer(tmp_path: Path) -> None:
    """Rank 2 runs another program and never joins the second all-reduce: ranks 0 and 1 wait in it past the
    3 s deadline, and every rank stops saying which collective and where rank 2 is instead (the backend's
    own timeout, 120 s, would end the run much later and name neither)."""
    codes, outs, _ = _run(tmp_path, "stuck")
    assert all(c != 0 for c in codes), codes
    for r in range(3):
        assert "waited more than 3 s in all_reduce #1 over all ranks (second)" in outs[r], outs[r]
        assert "rank 2 is in no collective" in outs[r], outs[r]
        assert "done" not in outs[r]


def test_calibrate_collectives_have_deadlines_too(tmp_path: Path) -> None:
    """The collectives of `planner calibrate` run tracked, so the guard names them when a rank is missing."""
    codes, outs, _ = _run(tmp_path, "calibrate")
    assert len(set(codes)) == 1 and codes[0] != 0, codes
    for r in (0, 1):
        assert "in all_reduce #1 over all ranks (calibrate: the slowest rank's time)" in outs[r], outs[r]
        assert "rank 2 is in no collective" in outs[r], outs[r]


USER_SCRIPT = textwrap.dedent("""
    import sys, time
    import torch
    import planner
    from planner.models import build_mlp

    model, inputs = build_mlp(device="meta")
    p = planner.plan(model, "1GiB", world_size=4, example_inputs=inputs, schemes=["fsdp"], workers=1)
    with planner.distributed(timeout_s=3, poll_s=0.2, dead_after_s=5) as ctx:
        torch.manual_seed(0)
        dense, inputs = build_mlp()
        par = planner.apply_plan(dense, p)
        par(*inputs).sum().backward()  # the first step, on every rank
        if ctx.rank == 3:  # this rank leaves the training loop: the others wait in the next step's gather
            time.sleep(600)
        par(*inputs).sum().backward()
        print("done", ctx.rank, flush=True)
""")


def test_a_users_training_script_gets_deadlines_with_planner_distributed(tmp_path: Path) -> None:
    """Deadlines are not only for `planner verify`: a user's own script under `planner.distributed()` stops
    when one rank leaves the collective program, naming the collective and the rank that is not in it."""
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    port = free_port()
    procs = []
    for r in range(4):
        env = {**os.environ, "PYTHONPATH": ROOT, "RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert len(set(codes)) == 1 and codes[0] != 0, (codes, outs)
    for r in (0, 1, 2):
        assert "waited more than 3 s in" in outs[r] and "rank 3 is in no collective" in outs[r], outs[r]
        assert "done" not in outs[r]


class _SlowStore:
    """A store whose every call takes `delay_s` (a loaded machine's rendezvous store): the watchdog is inside
    one of its calls most of the time."""

    def __init__(self, delay_s: float) -> None:
        import torch.distributed as dist

        self._store, self.delay_s, self.calls = dist.HashStore(), delay_s, 0
        self.timeout = self._store.timeout

    def __getattr__(self, name: str):
        call = getattr(self._store, name)

        def slow(*args, **kwargs):
            self.calls += 1
            time.sleep(self.delay_s)
            return call(*args, **kwargs)
        return slow


def test_the_watchdog_has_left_the_store_when_the_block_ends() -> None:
    """A daemon thread that comes back from a store call while the interpreter shuts down aborts the process
    (SIGABRT after a passing run, seen in CI): the guard's block must not end while its watchdog is in a
    store call, however slow the store."""
    from planner.verify.guard import RankGuard

    store = _SlowStore(delay_s=0.4)

    def no_exit(code: int) -> None:
        raise AssertionError(f"the guard exited with {code}")

    guard = RankGuard(store, 0, 4, poll_s=0.01, dead_after_s=60, exit=no_exit)
    with guard:
        while store.calls < 3:  # the watchdog is inside its first sweep of the peers
            time.sleep(0.01)
    assert not guard._thread.is_alive()
