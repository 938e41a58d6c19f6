"""A plan is a function of (model, budget, mesh, hardware, options): every solver limit is counted in work,
so planning the same model twice, once while two busy processes load the machine, writes the same plan
file byte for byte apart from `solver.seconds`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cost_models.mesh import candidate_meshes
from planner import plan
from planner.models.loading import get_example
from planner.trace.tracer import capture

# A tight budget for gpt-tiny on 8 ranks (the smallest is about 443 KiB): the priced search, the uniform
# searches and the column ILPs all run (a loose budget would stop at the fastest assignment).
BUDGET = 600 * 1024
MESH = candidate_meshes(8, 8)[-1]  # 2x2x2: the most strategies per op, where the search does the most work
_BUSY_S = 300  # each busy process ends by itself after this many seconds, even if the test is killed


def _plan_text(graph, tmp_path: Path, name: str) -> str:
    p = plan(graph, BUDGET, world_size=8, workers=1, meshes=[MESH])
    path = tmp_path / name
    p.save(path)
    data = json.loads(path.read_text())
    assert data["solver"]["seconds"] > 0
    data["solver"]["seconds"] = 0.0
    return json.dumps(data, sort_keys=True)


def test_plans_are_identical_on_a_busy_machine(tmp_path: Path) -> None:
    ex = get_example("gpt-tiny")
    graph = capture(ex.model, ex.example_inputs, name="gpt-tiny")
    quiet = _plan_text(graph, tmp_path, "quiet.json")
    spin = f"import time\nend = time.time() + {_BUSY_S}\nwhile time.time() < end:\n    pass\n"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        loaded = _plan_text(graph, tmp_path, "loaded.json")
    finally:
        for proc in busy:
            proc.kill()
            proc.wait(timeout=10)
    assert json.loads(quiet)["solver"]["status"] in ("optimal", "feasible")
    assert loaded == quiet
