"""`torchrun --standalone --nproc-per-node 8 -m planner verify gpt-tiny plan.json` on CPU (gloo).

The plan is the mixed one (attention 3d, MLP 3d_allreduce, vocab-parallel embedding and head, the second
block checkpointed) with CPU semantics: the report must show every error within 1e-5, measured collective
bytes equal to the predicted ones for every kind and phase, and saved activations within 5 % on every
rank. Faults (a rank that raises or is killed) are tested without torchrun in test_verify_faults.py, so
that the project's own guard, not torchrun's agent, must stop the other ranks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from apply_plans import mixed_plan, uniform_plan
from paths import ROOT as REPO_ROOT

from planner.models.gpt import build_gpt
from planner.trace.tracer import capture

pytestmark = pytest.mark.distributed

ROOT = str(REPO_ROOT)


def torchrun(*args: str, ranks: int = 8, timeout: float = 400) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), "-m",
           "planner", "verify", *args]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - start


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    model, inputs = build_gpt("gpt-tiny", seed=0)
    path = tmp_path_factory.mktemp("verify") / "plan.json"
    p = mixed_plan(capture(model, inputs))
    assert p.options.device == "cpu" and p.checkpoint
    p.save(path)
    return str(path)


def test_verify_reports_equal_numerics_comm_and_activations(plan_file: str) -> None:
    done, _ = torchrun("gpt-tiny", plan_file, "--steps", "5")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert out.count("planner verify: gpt-tiny") == 1  # rank 0 alone prints the report
    errors = re.findall(r"^  (loss|outputs|gradients|parameters after 5 steps|loss after step \d)\s+(\S+)\s+ok",
                        out, re.M)
    assert len(errors) == 4 + 5 and all(float(e) <= 1e-5 for _, e in errors)
    comm = re.findall(r"^  (\w+) \((forward|backward|recompute)\)\s+([\d,]+)\s+([\d,]+)\s+(\S+)", out, re.M)
    assert {phase for _, phase, *_ in comm} == {"forward", "backward", "recompute"}
    assert all(m == p and mark == "ok" for _, _, m, p, mark in comm)
    total = re.search(r"^  total\s+([\d,]+)\s+([\d,]+)\s+ok", out, re.M)
    assert total and total.group(1) == total.group(2)
    acts = re.findall(r"^  rank (\d)\s+([\d,]+)\s+([\d,]+)\s+([+-][\d.]+)%\s+ok", out, re.M)
    assert sorted(int(r) for r, *_ in acts) == list(range(8))
    assert all(abs(float(d)) <= 5.0 for *_, d in acts)
    assert out.rstrip().endswith("PASS")


@pytest.fixture(scope="module")
def plan4(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 1d plan for 4 ranks (the failure tests need no more)."""
    model, inputs = build_gpt("gpt-tiny", seed=0)
    path = tmp_path_factory.mktemp("verify4") / "plan4.json"
    uniform_plan(capture(model, inputs), "1d", world_size=4).save(path)
    return str(path)


def test_an_error_beyond_the_tolerance_exits_1(plan4: str) -> None:
    done, _ = torchrun("gpt-tiny", plan4, "--tol", "1e-12", ranks=4)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "FAIL" in done.stdout and done.stdout.rstrip().endswith("FAIL: numerics")


def test_outside_torchrun_it_says_how_to_start(plan4: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "planner", "verify", "gpt-tiny", plan4], cwd=ROOT,
                          env={**env, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "torchrun --standalone --nproc-per-node" in done.stderr
