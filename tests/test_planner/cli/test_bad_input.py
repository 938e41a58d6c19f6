"""Every bad input a user can give the command line: one `error: ...` line (what was wrong, how to fix
it), no traceback, and the documented exit status (2 a user error, 3 nothing fits the budget).

Also covered elsewhere: budgets that do not parse, --world-size 0, empty --schemes, truncated / non-JSON /
newer-schema plan files under `explain` (test_cli.py); every malformed plan field (test_plan_format.py);
faults under `verify` (test_verify_faults.py).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT as REPO_ROOT
from ports import free_port

import planner.plans.format as plan_format
from cost_models.hardware import BUILTIN_PROFILES, ProfileError, load_profile
from cost_models.mesh import Mesh, MeshError
from planner.api import InfeasibleError, WorldSizeError, plan
from planner.cli.app import main
from planner.models.mlp import build_mlp
from planner.plans.check import check_layouts
from planner.plans.format import Plan, PlanError
from planner.search.solve import Solution
from planner.trace.tracer import capture

ROOT = str(REPO_ROOT)
MODELS = '''\
import torch
from planner.models.gpt import build_gpt
from planner.models.mlp import build_mlp


def only_model():
    return build_mlp()[0]


def not_a_model():
    return 42, (torch.ones(2),)


def no_tensors():
    return build_mlp()[0], ("a", 3)


def raises():
    raise KeyError("boom")


def misfit_inputs():
    model, (x, targets) = build_mlp()
    return model, (torch.ones(3, 5), targets)


not_callable = 5


class Cumsum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.cumsum(self.fc(x), dim=1).pow(2).mean()


def cumsum():
    return Cumsum(), (torch.randn(8, 16),)


def deep():
    return build_gpt("gpt-tiny", device="meta", n_layer=6, n_embd=128, n_head=4, seq_len=64, vocab_size=512)
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "models.py"
    path.write_text(MODELS)
    return path


def _run(argv: list[str], capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capfd.readouterr()  # file descriptors: torch's own log handlers write there too
    return code, out, err


def _one_error_line(err: str, start: str) -> None:
    assert err.startswith(f"error: {start}"), err
    assert err.count("\n") == 1 and "Traceback" not in err, err


PLAN = ["--budget", "1GiB", "--world-size", "2"]


# --- the MODEL argument ------------------------------------------------------------------------------

@pytest.mark.parametrize(("factory", "message"), [
    ("missing", "{path} has no attribute 'missing': define `def missing(): return model, example_inputs`"),
    ("only_model", "factory {path}:only_model returned a MLP; expected (model, example_inputs)"),
    ("not_a_model", "factory {path}:not_a_model returned a int as the model; expected (model, example_inputs)"),
    ("no_tensors", "factory {path}:no_tensors returned example inputs a tuple of 2 (str, int) with no tensor"),
    ("raises", "factory {path}:raises raised KeyError: 'boom'"),
    ("not_callable", "{path}:not_callable is a int, not a function"),
    ("misfit_inputs", "could not capture models:misfit_inputs (fx and export failed): fx: RuntimeError: a and b"),
])
def test_a_bad_factory_is_one_line(models: Path, factory: str, message: str, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["plan", f"{models}:{factory}", *PLAN, "--out", str(models.parent / "p.json")], capfd)
    assert code == 2
    _one_error_line(err, message.format(path=models))
    assert not (models.parent / "p.json").exists()


def test_a_model_file_that_does_not_exist(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", str(tmp_path / "nope.py:model"), *PLAN], capfd)
    assert code == 2
    _one_error_line(err, f"model file '{tmp_path / 'nope.py'}' does not exist")
    assert "give a path to a .py file" in err


def test_a_model_file_that_does_not_import(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken.py").write_text("x = (\n")
    code, _, err = _run(["plan", f"{tmp_path / 'broken.py'}:model", *PLAN], capfd)
    assert code == 2
    _one_error_line(err, f"importing {tmp_path / 'broken.py'} failed: SyntaxError")


def test_a_module_that_does_not_exist(capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", "no_such_package.models:build", *PLAN], capfd)
    assert code == 2
    _one_error_line(err, "cannot import module 'no_such_package.models'")


def test_debug_keeps_the_traceback_of_a_capture_failure(models: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", f"{models}:misfit_inputs", *PLAN, "--debug"], capfd)
    assert code == 2 and "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error: could not capture")


# --- numbers ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["--world-size", "-2"], "--world-size must be a positive number of ranks, got -2"),
    (["--bytes-per-param", "0"], "bytes_per_param must be a positive integer, got 0"),
    (["--bytes-per-param", "lots"], "bytes_per_param 'lots': use a positive integer or one of fp32_adam (16)"),
    (["--schemes", "4d"], "unknown scheme '4d'; use any of: replicate, fsdp, 1d"),
])
def test_bad_numbers_and_names(argv: list[str], message: str, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", "mlp", "--budget", "1GiB", *(["--world-size", "2"] if "--world-size" not in argv
                                                               else []), *argv], capfd)
    assert code == 2
    _one_error_line(err, message)


@pytest.mark.parametrize("world", [0, -1, True, "8"])
def test_the_api_refuses_a_world_size_that_is_not_a_positive_int(world: object) -> None:
    model, inputs = build_mlp(device="meta")
    with pytest.raises(WorldSizeError, match="world size must be a positive integer"):
        plan(model, "1GiB", world_size=world, example_inputs=inputs)  # type: ignore[arg-type]



@pytest.mark.parametrize("mesh", ["2x2x", "2,4", (2, 4.0), (), 8, None])
def test_the_api_refuses_a_mesh_that_is_not_a_shape(mesh: object) -> None:
    model, inputs = build_mlp(device="meta")
    with pytest.raises(MeshError, match=r"is not a mesh shape; give Mesh\(\(2, 4\)\), a tuple of ints"):
        plan(model, "1GiB", world_size=8, example_inputs=inputs, meshes=[mesh])  # type: ignore[list-item]


def test_the_api_takes_a_mesh_as_a_shape_tuple_or_a_string() -> None:
    """meshes=["2x4"], [(2, 4)] and [Mesh((2, 4))] are the same plan; a shape of the wrong size names both."""
    model, inputs = build_mlp(device="meta")
    graph = capture(model, inputs)
    plans = [json.loads(plan(graph, "1GiB", world_size=8, meshes=[m], workers=1).to_json())
             for m in ("2x4", (2, 4), Mesh((2, 4)))]
    for p in plans:
        del p["solver"]["seconds"]
    assert plans[0] == plans[1] == plans[2]
    assert plans[0]["mesh"]["shape"] == [2, 4]
    with pytest.raises(MeshError, match="mesh 2x2"):
        plan(graph, "1GiB", world_size=8, meshes=["2x2"], workers=1)

# --- hardware profiles -------------------------------------------------------------------------------

def _profile(tmp_path: Path, **changes: object) -> str:
    data = BUILTIN_PROFILES["a100-80gb"].to_json()
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(("changes", "message"), [
    ({"inter_beta": None}, "hardware profile 'a100-80gb' is missing field(s) ['inter_beta']"),
    ({"intra_alfa": 1e-6}, "hardware profile 'a100-80gb' has unknown field(s) ['intra_alfa']"),
    ({"efficiency": 5}, "profile 'a100-80gb': efficiency must be in [0.001, 1] (the achieved fraction of peak; 0.3-0.8 for large matmuls), got 5"),
    ({"memory_bytes": -1}, "profile 'a100-80gb': memory_bytes must be positive bytes per rank"),
    ({"memory_bytes": 10**30}, "profile 'a100-80gb': memory_bytes must be positive bytes per rank, at most"),
    ({"peak_flops": {"fp32": 1e25}}, "profile 'a100-80gb': peak_flops[fp32] = 1e+25 FLOP/s per rank is beyond"),
    ({"mem_bandwidth": 2e18}, "profile 'a100-80gb': mem_bandwidth = 2e+18 bytes/s is beyond any device"),
    ({"intra_beta": 300e9}, "profile 'a100-80gb': beta of intra = 3e+11 s/byte is a link of"),  # GB/s for s/B
    ({"inter_alpha": 9.6}, "profile 'a100-80gb': alpha of inter = 9.6 s per ring step is absurd"),
    ({"gpus_per_node": 0}, "profile 'a100-80gb': gpus_per_node must be in [1, 4096], got 0"),
    ({"device": "tpu"}, "profile 'a100-80gb': device must be one of"),
])
def test_a_bad_hardware_profile_is_one_line(tmp_path: Path, changes: dict[str, object], message: str,
                                            capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", "mlp", *PLAN, "--hardware", _profile(tmp_path, **changes)], capfd)
    assert code == 2
    _one_error_line(err, message)


def test_a_hardware_profile_that_is_not_json_or_not_there(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.json").write_text("alpha = 1")
    code, _, err = _run(["plan", "mlp", *PLAN, "--hardware", str(tmp_path / "p.json")], capfd)
    assert code == 2
    _one_error_line(err, f"hardware profile file '{tmp_path / 'p.json'}' is not valid JSON")
    code, _, err = _run(["plan", "mlp", *PLAN, "--hardware", "v100"], capfd)
    assert code == 2
    _one_error_line(err, "unknown hardware profile 'v100': not a built-in name")


# --- plan and profile files are data ---------------------------------------------------------------------

class _Payload:
    """Unpickling this creates the file `path`: proof that a loader ran code from a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (os.makedirs, (self.path,))


def test_loading_a_plan_or_profile_never_runs_code_from_it(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "was_executed"
    evil = tmp_path / "evil.json"
    evil.write_bytes(pickle.dumps(_Payload(str(marker))))
    with pytest.raises(PlanError):
        Plan.load(evil)
    with pytest.raises(ProfileError):
        load_profile(str(evil))
    code, _, err = _run(["explain", str(evil)], capfd)
    assert code == 2 and err.startswith("error: ")
    code, _, err = _run(["plan", "mlp", *PLAN, "--hardware", str(evil)], capfd)
    assert code == 2 and err.startswith("error: ")
    # Python source in a string field stays a string.
    path = tmp_path / "plan.json"
    model, inputs = build_mlp(device="meta")
    p = plan(model, "1GiB", world_size=2, example_inputs=inputs, hardware="cpu-gloo")
    p.model.name = f"__import__('os').makedirs({str(marker)!r})"
    p.save(path)
    assert Plan.load(path).model.name == p.model.name
    code, out, _ = _run(["explain", str(path)], capfd)
    assert code == 0
    assert not marker.exists()


# --- plan files edited into an inconsistent state --------------------------------------------------------

def _edited(world: int, change: str) -> tuple[object, Plan]:
    model, inputs = build_mlp(device="meta", n_classes=5)  # the head's 5 classes do not split 2 ways
    graph = capture(model, inputs)
    data = plan(graph, "1GiB", world_size=world, hardware="cpu-gloo").to_dict()
    fc1 = next(a for a in data["assignments"] if a["node"] == "blocks_0_fc1")
    head = next(a for a in data["assignments"] if a["node"] == "head")
    if change == "dims":
        fc1["inputs"][0] = {"dims": [[], [], ["x"]]}
    elif change == "param":
        fc1["params"]["weight"] = {"dims": [["x"]]}
    elif change == "split":
        head["outputs"][0] = {"dims": [[], ["x"]]}
    elif change == "node":
        fc1["node"] = "blocks_9_fc1"
        for op in data["predicted"]["per_op"]:
            op["node"] = "blocks_9_fc1" if op["node"] == "blocks_0_fc1" else op["node"]
    return graph, Plan.from_dict(data)


@pytest.mark.parametrize(("change", "message"), [
    ("dims", r"assignments\[\d+\] \(blocks_0_fc1\)\.inputs\[0\]: layout \[-, -, x\] has 3 dims but the tensor has "
             r"shape \(32, 64\)"),
    ("param", r"\(blocks_0_fc1\)\.params\[weight\]: layout \[x\] has 1 dims but the tensor has shape \(256, 64\)"),
    ("split", r"\(head\)\.outputs\[0\]: dim 1 of size 5 cannot be split 2 ways over mesh axes \('x',\)"),
    ("node", r"\(blocks_9_fc1\): the model has no op 'blocks_9_fc1'"),
])
def test_layouts_edited_to_not_fit_the_shapes_are_refused(change: str, message: str) -> None:
    graph, edited = _edited(2, change)
    with pytest.raises(PlanError, match=message):
        check_layouts(graph, edited)


def test_verify_refuses_an_edited_plan_with_one_line(tmp_path: Path) -> None:
    """`planner verify` (one rank, no launcher) on a plan whose layouts no longer fit: exit 2, no traceback."""
    _, edited = _edited(1, "dims")
    path = tmp_path / "edited.json"
    edited.save(path)
    (tmp_path / "m.py").write_text("from planner.models.mlp import build_mlp\n\n\n"
                                   "def model():\n    return build_mlp(n_classes=5)\n")
    env = {**os.environ, "PYTHONPATH": ROOT, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "planner", "verify", f"{tmp_path / 'm.py'}:model", str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "rank 0: error: PlanError: assignments[" in done.stderr
    assert "has 3 dims but the tensor has shape (32, 64)" in done.stderr and "Traceback" not in done.stderr


# --- ops without a strategy, solver time limits ------------------------------------------------------------

def test_an_op_without_a_strategy_runs_replicated_and_is_reported(models: Path, tmp_path: Path,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "p.json"
    code, _, err = _run(["plan", f"{models}:cumsum", *PLAN, "--out", str(out_file)], capfd)
    assert code == 0, err
    assert "note: 1 op(s) have no parallel strategy and run replicated" in err and "cumsum (torch.cumsum)" in err
    cumsum = next(a for a in Plan.load(out_file).assignments if a.kind == "other")
    assert cumsum.scheme == "replicate" and all(not lay.axes() for lay in cumsum.inputs + cumsum.outputs if lay)
    code, out, _ = _run(["explain", str(out_file)], capfd)
    assert code == 0 and "ops without a parallel strategy, run replicated: cumsum" in out


def test_a_time_limit_returns_the_best_plan_found_with_its_gap(models: Path, tmp_path: Path,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "p.json"
    code, out, err = _run(["plan", f"{models}:deep", "--budget", "8MiB", "--world-size", "8", "--time-limit",
                           "0.01", "--out", str(out_file)], capfd)
    assert code == 0, err
    solver = Plan.load(out_file).solver
    assert solver.status in ("optimal", "feasible")  # optimal only if the first answer was proven in time
    summary = next(line for line in out.splitlines() if "solver" in line)
    assert f"{solver.status} in" in summary and "gap" in summary


def test_a_time_limit_with_no_plan_found_says_raise_the_limit(monkeypatch: pytest.MonkeyPatch,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    import planner.plans.meshes as plan_meshes

    def stopped(problem: object, **options: object) -> Solution:  # what solve() returns when stopped empty
        return Solution(status="error", solver="highs",
                        message="no answer within time_limit=0.01 s (stopped); raise time_limit")

    monkeypatch.setattr(plan_meshes, "solve", stopped)  # the mesh workers are forked: they see the patch
    code, _, err = _run(["plan", "mlp", *PLAN, "--time-limit", "0.01"], capfd)
    assert code == 2
    _one_error_line(err, "no plan for mlp on 2 ranks: mesh 2(x): no answer within time_limit=0.01 s (stopped); "
                         "raise time_limit")


# --- plan --out never leaves a partial file ---------------------------------------------------------------

def test_a_failed_plan_run_leaves_an_existing_plan_file_as_it_was(models: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "plan.json"
    out_file.write_text("the previous plan\n")
    code, _, err = _run(["plan", "mlp", "--budget", "1KiB", "--world-size", "2", "--out", str(out_file)], capfd)
    assert code == 3 and "smallest budget that fits" in err  # infeasible
    code, _, _ = _run(["plan", f"{models}:raises", *PLAN, "--out", str(out_file)], capfd)
    assert code == 2  # the model does not load

    def disk_full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plan_format.os, "replace", disk_full)  # the rename of the finished temporary file
    code, _, err = _run(["plan", "mlp", *PLAN, "--out", str(out_file)], capfd)
    assert code == 2
    _one_error_line(err, f"cannot write the plan to '{out_file}': No space left on device")
    assert out_file.read_text() == "the previous plan\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no temporary file left behind


def test_out_in_a_folder_that_does_not_exist(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", "mlp", *PLAN, "--out", str(tmp_path / "no" / "plan.json")], capfd)
    assert code == 2
    _one_error_line(err, f"cannot write the plan to '{tmp_path / 'no' / 'plan.json'}'")


def test_infeasible_error_is_a_value_error_with_the_budget() -> None:
    model, inputs = build_mlp(device="meta")
    with pytest.raises(InfeasibleError) as info:
        plan(model, 1024, world_size=2, example_inputs=inputs, hardware="cpu-gloo")
    assert isinstance(info.value, ValueError) and info.value.min_budget_bytes > 1024
