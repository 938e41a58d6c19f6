"""User errors and bugs are told apart: every error a user can cause is a `PlannerError` (and still a
ValueError), which the command line prints as one `error:` line; anything else is a bug, printed as one
`internal error, please report` line with the traceback under --debug. A planning worker's exception
reaches the user with the frames where it was raised. The exported API names are never shadowed by
submodules."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from paths import ROOT as REPO_ROOT
from plan_examples import make_plan

import planner
from cost_models.errors import PlannerError
from cost_models.mesh import Mesh
from planner.cli.app import EXIT_INTERNAL, main
from planner.plans.format import Plan
from planner.plans.meshes import MeshResult
from planner.plans.workers import WorkerTraceback, plan_meshes

ROOT = str(REPO_ROOT)
PACKAGES = ("cost_models", "layers3d", "planner")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        names += [m.name for m in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")]
    return [n for n in names if not n.endswith("__main__")]


def test_every_value_error_class_of_the_packages_is_a_planner_error() -> None:
    found = []
    for name in _modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, ValueError):
                found.append(cls)
                assert issubclass(cls, PlannerError), f"{name}.{cls.__name__} is a ValueError but not a PlannerError"
    assert len(found) >= 27  # the error classes of issue 15, and the ones added since


def test_planner_error_is_exported() -> None:
    assert planner.PlannerError is PlannerError
    from planner import PlannerError as exported

    assert exported is PlannerError


def test_a_bug_is_one_internal_error_line_and_debug_shows_the_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "plan.json"
    make_plan().save(path)

    def broken(cls: type, p: object) -> Plan:
        raise ValueError("a bug inside the planner")  # a plain ValueError is not a user error

    monkeypatch.setattr(Plan, "load", classmethod(broken))
    assert main(["explain", str(path)]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("internal error, please report it") and "ValueError: a bug inside the planner" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert main(["explain", str(path), "--debug"]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and "in broken" in err and err.rstrip().splitlines()[-1].startswith("internal error")


def test_a_user_error_is_still_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.json").write_text("[]")
    assert main(["explain", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def _explode_in_a_worker(mesh: Mesh, incumbent: object) -> MeshResult:
    if mesh.shape == (2, 2):
        (1, 2)[5]  # the IndexError of issue 14 (`build._join_producer`), here in a function of our own
    return MeshResult(mesh)


def test_an_exception_in_a_planning_worker_shows_where_it_was_raised() -> None:
    meshes = [Mesh((4,)), Mesh((2, 2))]
    with pytest.raises(IndexError) as info:
        plan_meshes(meshes, _explode_in_a_worker, time_limit=60, workers=2)
    cause = info.value.__cause__
    assert isinstance(cause, WorkerTraceback)
    assert "_explode_in_a_worker" in cause.frames and "(1, 2)[5]" in cause.frames
    printed = "".join(traceback.format_exception(info.value))
    assert "_explode_in_a_worker" in printed and "tuple index out of range" in printed


def test_capture_is_the_function_every_time_also_after_planning() -> None:
    """`planner.capture` was both the exported function and a submodule; after the submodule was imported
    (planning imports it), `planner.capture` became the module. The capture stage is the package `planner.trace`
    now."""
    code = ("import planner\n"
            "from planner.models import get_example\n"
            "def check():\n"
            "    a = planner.capture\n"
            "    from planner import capture\n"
            "    for name in ('capture', 'plan', 'apply_plan'):\n"
            "        assert callable(getattr(planner, name)) and not hasattr(getattr(planner, name), '__path__'), name\n"
            "    assert a is capture is planner.capture and callable(capture), (a, capture, planner.capture)\n"
            "check()\n"
            "ex = get_example('mlp')\n"
            "p = planner.plan(ex.model, '1GiB', world_size=2, example_inputs=ex.example_inputs, workers=1)\n"
            "import planner.verify.run, planner.cli.verify, planner.cli.calibrate, planner.calibrate.run, planner.apply.rewrite, planner.trace.tracer\n"
            "check()\n"
            "assert 'per_op=[' in repr(p.predicted) and 'OpPrediction' not in repr(p.predicted)\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_no_exported_name_is_a_submodule() -> None:
    submodules = {m.name.rsplit(".", 1)[-1] for m in pkgutil.iter_modules(planner.__path__)}
    assert not set(planner.__all__) & submodules


def test_predicted_repr_counts_the_per_op_rows() -> None:
    p = make_plan().predicted
    text = repr(p)
    assert f"per_op=[{len(p.per_op)} ops]" in text and "OpPrediction" not in text
    assert f"peak_memory_bytes={p.peak_memory_bytes}" in text
