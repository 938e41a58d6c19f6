"""The plan file: deterministic JSON, atomic save, and a clear PlanError for every kind of bad file."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from plan_examples import make_plan

import planner.plans.format as plan_format
from cost_models.layout import Layout
from planner.plans.format import SCHEMA_VERSION, Plan, PlanError

TOP_LEVEL_KEYS = {"schema_version", "model", "mesh", "budget_bytes", "hardware", "assignments", "redistributions",
                  "checkpoint", "predicted", "solver", "feasible", "world_size", "options"}


def test_json_keys_follow_the_contract() -> None:
    data = json.loads(make_plan().to_json())
    assert set(data) == TOP_LEVEL_KEYS
    assert data["schema_version"] == SCHEMA_VERSION == 1
    assert set(data["model"]) == {"name", "fingerprint", "inputs"}
    assert data["mesh"] == {"shape": [2, 2, 2], "axis_names": ["x", "y", "z"], "ranks_per_node": 8}
    assert data["world_size"] == 8
    assert set(data["assignments"][0]) == {"node", "target", "kind", "scheme", "strategy", "inputs", "outputs",
                                           "params", "options", "block", "module_path", "cost", "not_offered"}
    assert set(data["assignments"][0]["cost"]) == {"state_bytes", "saved_bytes", "transient_bytes", "compute_s",
                                                   "comm_s", "comm_bytes", "recompute_s", "optimizer_bytes"}
    assert set(data["redistributions"][0]) == {"src", "dst", "shape", "src_layout", "dst_layout", "steps",
                                               "comm_bytes", "seconds"}
    assert set(data["predicted"]) == {"peak_memory_bytes", "model_state_bytes", "activation_bytes",
                                      "transient_bytes", "released_bytes", "optimizer_bytes", "step_time_s", "compute_s", "comm_s", "comm_bytes",
                                      "recompute_s", "per_op"}
    assert set(data["predicted"]["per_op"][0]) == {"node", "scheme", "time_s", "comm_bytes", "state_bytes",
                                                   "saved_bytes"}
    assert set(data["solver"]) == {"name", "status", "objective", "gap", "seconds", "method", "bound", "message"}
    assert set(data["options"]) == {"bytes_per_param", "device", "checkpointing", "schemes", "inputs",
                                     "optimizer"}
    assert data["assignments"][1]["inputs"][0] == {"dims": [[], ["x", "y"], ["z"]]}


def test_round_trip_is_byte_identical() -> None:
    text = make_plan().to_json()
    again = Plan.from_json(text)
    assert again == make_plan()
    assert again.to_json() == text
    assert make_plan().to_json() == text  # deterministic across separately built plans
    assert json.loads(text) == make_plan().to_dict()


def test_floats_are_written_by_repr() -> None:
    plan = make_plan()
    plan.predicted.per_op[0].time_s = 0.1 + 0.2
    text = plan.to_json()
    assert repr(0.1 + 0.2) in text
    assert Plan.from_json(text).predicted.per_op[0].time_s == 0.1 + 0.2


def test_attribute_access_and_strategy() -> None:
    plan = Plan.from_json(make_plan().to_json())
    assert plan.feasible is True
    assert plan.predicted.peak_memory_bytes == 22_810_624  # at wte's backward (tests/plan_examples.py)
    assert plan.predicted.released_bytes == 25_563_136 - 22_810_624  # states + saved + transient - peak
    assert plan.predicted.activation_bytes == 397_312
    assert plan.predicted.step_time_s == pytest.approx(0.0020875)
    assert plan.world_size == 8
    strategy = plan.assignments[1].to_strategy()
    assert strategy.option("roles") == ("x", "y", "z")
    assert strategy.inputs == (Layout(((), ("x", "y"), ("z",))),)
    assert strategy.label() == plan.assignments[1].strategy


def test_tuples_and_numpy_numbers_are_written_as_json() -> None:
    np = pytest.importorskip("numpy")
    plan = make_plan()
    plan.assignments[1].options = {"roles": ("x", "y", "z"), "save_input": "shard"}
    plan.assignments[1].cost.state_bytes = np.int64(4_718_592)
    assert plan.to_json() == make_plan().to_json()


def test_unknown_objective_is_written_as_null() -> None:
    plan = make_plan()
    plan.solver.objective = math.nan
    data = json.loads(plan.to_json())
    assert data["solver"]["objective"] is None
    assert Plan.from_json(plan.to_json()).solver.objective is None


def test_to_json_refuses_a_plan_that_would_not_load() -> None:
    plan = make_plan()
    plan.assignments[0].scheme = "4d"
    with pytest.raises(PlanError, match=r"assignments\[0\]\.scheme: unknown scheme '4d'"):
        plan.to_json()
    plan = make_plan()
    plan.hardware["handle"] = object()
    with pytest.raises(PlanError, match=r"hardware\.handle: a object cannot be written"):
        plan.to_json()


def test_save_and_load(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    make_plan().save(path)
    assert path.read_text() == make_plan().to_json()
    assert Plan.load(path) == make_plan()
    assert Plan.load(str(path)) == make_plan()
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_a_plan_written_before_released_bytes_loads_with_its_peak_as_the_bound() -> None:
    data = make_plan().to_dict()
    pred = data["predicted"]
    pred["peak_memory_bytes"] += pred.pop("released_bytes")  # what planner wrote before the field existed
    old = Plan.from_json(json.dumps(data)).predicted
    assert old.released_bytes == 0 and old.peak_memory_bytes == old.bound_bytes == make_plan().predicted.bound_bytes
    del data["schema_version"]  # a key without a default is still required
    with pytest.raises(PlanError, match="schema_version"):
        Plan.from_json(json.dumps(data))


def _fail(*_: Any, **__: Any) -> Any:
    raise RuntimeError("simulated failure")


@pytest.mark.parametrize("target", ["format_json", "os.fsync", "os.replace"])
def test_failed_save_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          target: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text("the previous plan\n")
    if target == "format_json":      # serialisation fails before any file is touched
        monkeypatch.setattr(plan_format, "format_json", _fail)
    else:                            # failures after the temporary file was written
        monkeypatch.setattr(plan_format.os, target.split(".")[1], _fail)
    with pytest.raises(RuntimeError, match="simulated failure"):
        make_plan().save(path)
    assert path.read_text() == "the previous plan\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_load_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"cannot read plan file .*nope\.json"):
        Plan.load(tmp_path / "nope.json")


def test_load_errors_start_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(make_plan().to_json()[:200])
    with pytest.raises(PlanError) as info:
        Plan.load(path)
    assert str(info.value).startswith(f"{path}: not valid JSON")
    assert "truncated" in str(info.value)


def _edit(change: Callable[[dict[str, Any]], None]) -> str:
    data = copy.deepcopy(make_plan().to_dict())
    change(data)
    return json.dumps(data)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change that sets the field at a dotted path ("assignments.1.cost.saved_bytes")."""
    *parents, last = path.split(".")

    def change(data: dict[str, Any]) -> None:
        node: Any = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return change


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    *parents, last = path.split(".")

    def change(data: dict[str, Any]) -> None:
        node: Any = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        del node[last]
    return change


BAD_FILES = {
    "not json": ("this is not a plan", "not valid JSON"),
    "truncated": (make_plan().to_json()[:-40], "truncated"),
    "empty": ("", "not valid JSON"),
    "a list": ("[1, 2]", "a plan is a JSON object, got a list"),
    "NaN": (make_plan().to_json().replace('"compute_s": 1.5e-05', '"compute_s": NaN'), "NaN"),
    "no schema_version": (_edit(_delete("schema_version")), "missing key 'schema_version'"),
    "newer schema": (_edit(_set("schema_version", SCHEMA_VERSION + 1)), "newer planner"),
    "older schema": (_edit(_set("schema_version", 0)), "re-plan"),
    "schema as string": (_edit(_set("schema_version", "1")), "schema_version: expected an integer"),
    "missing top key": (_edit(_delete("predicted")), "missing key 'predicted' in the top level"),
    "missing nested key": (_edit(_delete("assignments.1.cost.saved_bytes")),
                           r"missing key 'saved_bytes' in assignments[1].cost"),
    "unknown key": (_edit(_set("solver.temperature", 3)), "unknown key 'temperature' in solver"),
    "budget as string": (_edit(_set("budget_bytes", "16GiB")), "budget_bytes: expected an integer, got a string"),
    "feasible as string": (_edit(_set("feasible", "yes")), "feasible: expected true or false"),
    "feasible not derived": (_edit(_set("feasible", False)), "feasible: False does not match the plan"),
    "float for int": (_edit(_set("predicted.comm_bytes", 1.5)), "predicted.comm_bytes: expected an integer"),
    "inputs not a list": (_edit(_set("assignments.0.inputs", {})), "assignments[0].inputs: expected a list"),
    "negative size": (_edit(_set("assignments.1.cost.saved_bytes", -5)),
                      "assignments[1].cost.saved_bytes: must not be negative"),
    "negative time": (_edit(_set("redistributions.1.seconds", -1.0)), "redistributions[1].seconds: must not be"),
    "zero budget": (_edit(_set("budget_bytes", 0)), "budget_bytes: must be at least 1 byte"),
    "unknown scheme": (_edit(_set("assignments.1.scheme", "4d")), "assignments[1].scheme: unknown scheme '4d'"),
    "unknown per-op scheme": (_edit(_set("predicted.per_op.0.scheme", "4d")), "predicted.per_op[0].scheme"),
    "unknown option scheme": (_edit(_set("options.schemes", ["3d", "5d"])), "options.schemes[1]"),
    "unknown axis": (_edit(_set("assignments.1.inputs.0", {"dims": [[], ["q"], ["z"]]})),
                     "assignments[1].inputs[0]: layout [-, q, z] uses mesh axis 'q'"),
    "unknown partial axis": (_edit(_set("assignments.1.outputs.0", {"dims": [[], ["x"], []], "partial": ["w"]})),
                             "assignments[1].outputs[0]: layout [-, x, -]+P(w) uses mesh axis 'w'"),
    "malformed layout": (_edit(_set("assignments.2.outputs.0", {"dims": "xy"})), "assignments[2].outputs[0]: malformed"),
    "axis twice": (_edit(_set("assignments.2.outputs.0", {"dims": [["x"], ["x"], []]})), "appears twice"),
    "layout does not fit": (_edit(_set("redistributions.0.shape", [8, 128, 767])),
                            "redistributions[0].dst_layout: dim 2 of size 767"),
    "bad mesh": (_edit(_set("mesh.shape", [2, 0, 2])), "mesh: mesh axis sizes must be positive"),
    "mesh keys": (_edit(_delete("mesh.ranks_per_node")), "mesh: expected an object with keys"),
    "world size": (_edit(_set("world_size", 64)), "world_size: 64 does not match the mesh"),
    "peak": (_edit(_set("predicted.peak_memory_bytes", 1)), "predicted.peak_memory_bytes: 1 is not model_state"),
    "duplicate node": (_edit(_set("assignments.2.node", "h_0_fc")), "node 'h_0_fc' is assigned twice"),
    "per-op node": (_edit(_set("predicted.per_op.0.node", "ghost")), "predicted.per_op[0].node: 'ghost'"),
    "checkpoint block": (_edit(_set("checkpoint", ["h.7"])), "checkpoint[0]: block 'h.7'"),
    "device": (_edit(_set("options.device", "tpu")), "options.device: 'tpu'"),
    "optimizer": (_edit(_set("options.optimizer", "adam")), "options.optimizer: 'adam' is not one of single_tensor"),
    "solver status": (_edit(_set("solver.status", "great")), "solver.status: 'great'"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_every_bad_file_is_a_clear_plan_error(case: str) -> None:
    text, expected = BAD_FILES[case]
    with pytest.raises(PlanError) as info:
        Plan.from_json(text)
    assert expected in str(info.value)
    assert isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)
