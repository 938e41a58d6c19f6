"""notebooks/01_walkthrough.ipynb runs top to bottom in a fresh kernel and draws its pictures.

The kernel is this interpreter (`sys.executable -m ipykernel_launcher`), declared in a kernelspec written to
a temporary JUPYTER_PATH, so the test needs no `ipykernel install` and cannot pick up a "python3" kernel of
some other environment on the machine.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from paths import ROOT as REPO_ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = REPO_ROOT / "notebooks" / "01_walkthrough.ipynb"
KERNEL = "planner-test-python"
CELL_TIMEOUT_S = 600  # the whole notebook takes about a minute; this only stops a hung kernel


@pytest.fixture
def kernel_name(tmp_path, monkeypatch) -> str:
    spec = tmp_path / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "planner tests", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    # The kernel starts in notebooks/: put this checkout first, so it runs the code under test (not another
    # checkout an editable install may point to).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(NOTEBOOK.parents[1]), os.environ.get("PYTHONPATH", "")]))
    return KERNEL


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(not c.outputs and c.execution_count is None for c in code), "clear the notebook's outputs"


# Appended to the notebook's cells when the test runs it (not saved): what the notebook computed, as JSON.
RESULTS_CELL = """
import json as _json
print("RESULTS " + _json.dumps({
    "low": span.low, "high": span.high, "budgets": budgets,
    "bounds": [p.predicted.bound_bytes for p in plans], "steps": [p.predicted.step_time_s for p in plans],
    "curves": {c.label: [[b, p.predicted.step_time_s] for b, p in c.feasible] for c in [planner_curve, *baselines]},
}))
"""


@pytest.mark.timeout(900)
def test_notebook_runs_and_draws_its_pictures(kernel_name):
    """The notebook runs, draws its three pictures, and what it computed holds: every plan of the sweep fits
    its budget, and more memory never makes a plan slower (the planner's or a uniform-scheme baseline's). (No wall-clock limit: a loaded CI machine may take several times longer than
    a quiet one.)"""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(RESULTS_CELL))
    client = nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=CELL_TIMEOUT_S,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError, with the cell and the traceback, if any cell fails
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 3, f"expected the scheme map, the memory bars and the frontier, got {len(images)} images"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "plans fit from" in text and "planner" in text
    results = json.loads(next(line for line in text.splitlines() if line.startswith("RESULTS "))[len("RESULTS "):])
    budgets, bounds, steps = results["budgets"], results["bounds"], results["steps"]
    assert budgets == sorted(budgets) and budgets[0] == results["low"] and budgets[-1] == results["high"]
    assert len(budgets) >= 2 and all(bound <= budget for bound, budget in zip(bounds, budgets)), (bounds, budgets)
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(steps, steps[1:])), steps
    assert [b for b, _ in results["curves"]["planner"]] == budgets  # the frontier is planned at the sweep's budgets
    for label, points in results["curves"].items():  # each curve: more memory never slower either
        times = [t for _, t in points]
        assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(times, times[1:])), (label, points)
