"""Faults under `planner verify`, with no launcher: a rank that raises or is killed stops every rank.

The ranks are N plain `python -m planner verify ...` processes with torchrun's variables set by hand
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; rank 0 hosts the store). torchrun's agent would
SIGTERM the survivors as soon as one rank fails, which hides whether the project's own mechanism
(`planner.verify.guard.RankGuard`) works; here nothing else stops them, so every rank must exit non-zero
by itself, within the bound, naming the failing rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apply_plans import uniform_plan
from paths import ROOT as REPO_ROOT
from ports import free_port

from planner.models.gpt import build_gpt
from planner.trace.tracer import capture

pytestmark = pytest.mark.distributed

ROOT = str(REPO_ROOT)
WORLD = 4
BOUND_S = 60.0  # acceptance: every rank has exited within this many seconds of the fault

# A model factory that announces, per rank, that it has built its model (the parallel run starts right
# after), and raises on the rank named by PLANNER_TEST_FAIL_RANK.
FACTORY = """\
import os
from planner.models.gpt import build_gpt


def model():
    if os.environ.get("RANK") == os.environ.get("PLANNER_TEST_FAIL_RANK"):
        raise RuntimeError("rank three cannot build its model")
    built = build_gpt("gpt-tiny", seed=0)
    print(f"factory built on rank {os.environ['RANK']}", flush=True)
    return built
"""


@pytest.fixture(scope="module")
def plan4(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 1d plan of gpt-tiny for 4 ranks."""
    model, inputs = build_gpt("gpt-tiny", seed=0)
    path = tmp_path_factory.mktemp("faults") / "plan4.json"
    uniform_plan(capture(model, inputs), "1d", world_size=WORLD).save(path)
    return str(path)


class Ranks:
    """WORLD `python -m planner verify` processes, each writing stdout and stderr to its own file."""

    def __init__(self, tmp: Path, args: list[str], fail_rank: int | None = None) -> None:
        port = free_port()
        self.logs = [tmp / f"rank{r}.log" for r in range(WORLD)]
        self.procs: list[subprocess.Popen] = []
        for r in range(WORLD):
            env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "RANK": str(r),
                   "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "PLANNER_TEST_FAIL_RANK": str(fail_rank)}
            for k in ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
                env.pop(k, None)
            with self.logs[r].open("w") as log:
                self.procs.append(subprocess.Popen([sys.executable, "-m", "planner", "verify", *args], cwd=ROOT,
                                                   env=env, stdout=log, stderr=subprocess.STDOUT))

    def text(self, r: int) -> str:
        return self.logs[r].read_text(errors="replace")

    def wait_for(self, needle: str, timeout_s: float, ranks: tuple[int, ...] = tuple(range(WORLD))) -> None:
        """Wait until each of `ranks` has printed `needle` (fails the test if time runs out, or if a rank
        exits before every one of `ranks` printed it)."""
        deadline = time.monotonic() + timeout_s
        while not all(needle in self.text(r) for r in ranks):
            exited = [r for r, p in enumerate(self.procs) if p.poll() is not None]
            if exited and not all(needle in self.text(r) for r in ranks):
                time.sleep(0.2)  # the log may lag the exit by a moment
            if (exited and not all(needle in self.text(r) for r in ranks)) or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"ranks did not all print {needle!r} (exited: {exited}):\n"
                                     + "\n".join(f"--- rank {r}\n{self.text(r)[-1500:]}" for r in range(WORLD)))
            time.sleep(0.05)

    def wait(self, timeout_s: float) -> tuple[list[int | None], float]:
        """Exit codes (None for a rank still running after `timeout_s`, which is then killed) and the
        seconds until the last rank exited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s and any(p.poll() is None for p in self.procs):
            time.sleep(0.05)
        seconds = time.monotonic() - start
        codes = [p.poll() for p in self.procs]
        self.kill()
        return codes, seconds

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


def test_a_rank_that_raises_stops_every_rank(plan4: str, tmp_path: Path) -> None:
    factory = tmp_path / "faulty.py"
    factory.write_text(FACTORY)
    ranks = Ranks(tmp_path, [f"{factory}:model", plan4], fail_rank=3)
    try:
        ranks.wait_for("[planner] rank 3: error: ModelLoadError", timeout_s=180, ranks=(3,))  # the fault happened
        codes, seconds = ranks.wait(BOUND_S)
    finally:
        ranks.kill()
    texts = [ranks.text(r) for r in range(WORLD)]
    assert all(c is not None for c in codes), f"ranks still running {seconds:.0f} s after the fault: {codes}"
    assert codes[3] == 2, texts[3]  # a ModelLoadError is a user error: exit status 2, one line
    assert "Traceback" not in texts[3] and "rank three cannot build its model" in texts[3]
    for r in range(3):
        assert codes[r] != 0, texts[r]
        assert f"[planner] rank {r} stopping" in texts[r], texts[r]
        assert "rank 3: error: ModelLoadError" in texts[r] and "rank three cannot build its model" in texts[r]
        assert "PASS" not in texts[r]


# Rank 0 also hosts the rendezvous store when no launcher runs (slow: the default run kills rank 2 only).
@pytest.mark.parametrize("victim", [2, pytest.param(0, marks=pytest.mark.slow)])
def test_a_killed_rank_stops_every_other_rank_within_60_s(plan4: str, tmp_path: Path, victim: int) -> None:
    factory = tmp_path / "model.py"
    factory.write_text(FACTORY)
    ranks = Ranks(tmp_path, [f"{factory}:model", plan4, "--steps", "200"])
    try:
        ranks.wait_for("factory built on rank", timeout_s=180)  # every rank is starting the parallel run
        time.sleep(0.5)
        assert ranks.procs[victim].poll() is None, ranks.text(victim)
        ranks.procs[victim].send_signal(signal.SIGKILL)
        codes, seconds = ranks.wait(BOUND_S)
    finally:
        ranks.kill()
    texts = [ranks.text(r) for r in range(WORLD)]
    assert codes[victim] == -signal.SIGKILL
    survivors = [r for r in range(WORLD) if r != victim]
    assert all(codes[r] is not None for r in survivors), \
        f"ranks still running {BOUND_S:.0f} s after rank {victim} was killed: {codes}\n{texts}"
    # Rank 0 hosts the store: its death is seen as the store going away; any other rank's as its silence.
    cause = "lost the rendezvous store" if victim == 0 else f"rank {victim} stopped responding"
    for r in survivors:
        assert codes[r] != 0, texts[r]
        assert f"[planner] rank {r} stopping" in texts[r] and cause in texts[r], texts[r]
        assert "PASS" not in texts[r]
