"""`python -m planner.launch`: torchrun for verify/calibrate, whose last line on a failure is the planner's
own one-line error (not torchrun's ChildFailedError traceback), with the failing rank's exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT as REPO_ROOT

from planner.launch import main
from planner.models.mlp import build_mlp

ROOT = str(REPO_ROOT)


def test_a_launch_without_a_command_is_one_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--standalone", "--nproc-per-node", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: name the planner command") and err.count("\n") == 1


@pytest.mark.distributed
def test_a_failed_run_ends_with_the_planners_line(tmp_path: Path) -> None:
    from planner.api import plan

    model, inputs = build_mlp(device="meta")
    plan(model, "1GiB", world_size=4, example_inputs=inputs, workers=1).save(tmp_path / "plan4.json")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "planner.launch", "--standalone", "--nproc-per-node", "2", "verify",
                           "mlp", str(tmp_path / "plan4.json")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr  # the user error's status, from the rank
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith("error: PlanMismatchError: the plan is for 4 ranks") and last.endswith(")"), last
    assert "ChildFailedError" not in done.stderr and "Traceback" not in done.stderr
