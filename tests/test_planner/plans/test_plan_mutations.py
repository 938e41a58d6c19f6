"""Property test of the plan loader: a valid plan file mutated at random (a value replaced by another
JSON value, a key dropped or added, a list shortened or grown, the text cut or a byte changed) is either
loaded equal to what the file says, or refused with PlanError; never another exception, and a loaded plan
only names dtypes of the closed table and bounded shapes, and saves and loads back unchanged.

The default run draws a bounded number of examples (derandomised, so it is the same every run); the slow
run (`pytest -m slow tests/test_planner/plans/test_plan_mutations.py`) draws many more at random.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_examples import make_plan

from planner.plans.format import MAX_DIM_SIZE, MAX_DIMS, InputInfo, Plan, PlanError
from planner.trace.common import TORCH_DTYPES

_common = {"deadline": None, "database": None, "suppress_health_check": [HealthCheck.too_slow]}
DEFAULT = settings(max_examples=150, derandomize=True, **_common)
MANY = settings(max_examples=3000, derandomize=False, **_common)

# Strings chosen to reach torch or the runtime by name if a field were looked up on a module.
HOSTILE_STRINGS = ["nn", "load", "complex1024", "float32", "int64", "__import__", "os", "", " ", "1d", "3d",
                   "x", "xyz", "replicate", "follow", "\u0000", "a" * 300]
HOSTILE_NUMBERS = [0, -1, 1, 2, 7, 2**31, 2**40 + 1, 2**63, 10**30, -(10**30), 1e308, 1e-320, -0.0, 0.5, 2.5]


def _base() -> dict[str, Any]:
    plan = make_plan()
    plan.model.inputs = [InputInfo("idx", [8, 128], "int64"), InputInfo("x", [8, 128, 768], "float32")]
    return json.loads(plan.to_json())


BASE = _base()

json_values = st.recursive(
    st.none() | st.booleans() | st.sampled_from(HOSTILE_NUMBERS) | st.integers() | st.floats(allow_nan=False)
    | st.sampled_from(HOSTILE_STRINGS) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(HOSTILE_STRINGS) | st.text(max_size=6),
                                                                inner, max_size=4),
    max_leaves=12)


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(data, dict):
        for k, v in data.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _paths(v, prefix + (i,))
    return out


PATHS = _paths(BASE)


def _at(data: Any, path: tuple) -> Any:
    for k in path:
        data = data[k]
    return data


@st.composite
def mutated_texts(draw: st.DrawFn) -> str:
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        try:
            parent, target = (_at(data, path[:-1]), path[-1]) if path else (None, None)
            node = _at(data, path)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
        op = draw(st.sampled_from(["replace", "drop", "add_key", "grow", "shrink"]))
        if op == "replace" and parent is not None:
            parent[target] = draw(json_values)
        elif op == "drop" and isinstance(parent, dict):
            del parent[target]
        elif op == "add_key" and isinstance(node, dict):
            node[draw(st.sampled_from(HOSTILE_STRINGS))] = draw(json_values)
        elif op == "grow" and isinstance(node, list):
            node.append(copy.deepcopy(node[0]) if node and draw(st.booleans()) else draw(json_values))
        elif op == "shrink" and isinstance(node, list) and node:
            node.pop(draw(st.integers(0, len(node) - 1)))
    text = json.dumps(data)
    edit = draw(st.sampled_from(["none", "none", "cut", "byte"]))
    if edit == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif edit == "byte":
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + draw(st.sampled_from(list('{}[]",:0-9eE.x\\'))) + text[i + 1:]
    return text


def _agrees(loaded: Any, given: Any, path: str = "") -> None:
    """Every value the file gives is the value loaded (keys the loader fills with defaults are skipped)."""
    if isinstance(given, dict) and isinstance(loaded, dict):
        for k, v in given.items():
            if k in loaded:
                _agrees(loaded[k], v, f"{path}.{k}")
    elif isinstance(given, list) and isinstance(loaded, list):
        assert len(loaded) == len(given), path
        for i, (a, b) in enumerate(zip(loaded, given)):
            _agrees(a, b, f"{path}[{i}]")
    else:
        # an integer literal in a float field loads as the nearest float (JSON has one number type): 10**30
        # seconds loads as 1e30, which Python does not call equal to the integer
        expected = float(given) if isinstance(loaded, float) and type(given) is int else given
        assert loaded == expected and type(loaded) in (type(given), float), (path, loaded, given)


def _check(text: str) -> None:
    try:
        plan = Plan.from_json(text)
    except PlanError:
        return  # refused, with a message naming the field
    _agrees(plan.to_dict(), json.loads(text))
    for inp in plan.model.inputs:  # what reaches torch comes from closed tables and bounded sizes
        assert inp.dtype in TORCH_DTYPES and len(inp.shape) <= MAX_DIMS and all(s <= MAX_DIM_SIZE for s in inp.shape)
    again = plan.to_json()
    assert Plan.from_json(again).to_json() == again


def test_the_base_plan_loads() -> None:
    _check(json.dumps(BASE))
    assert Plan.from_json(json.dumps(BASE)).model.inputs[1].dtype == "float32"


@pytest.mark.parametrize("dtype", ["nn", "load", "complex1024", "Tensor", "float"])
def test_a_dtype_outside_the_table_is_refused(dtype: str) -> None:
    data = copy.deepcopy(BASE)
    data["model"]["inputs"][0]["dtype"] = dtype
    with pytest.raises(PlanError, match=r"model.inputs\[0\].dtype: .* is not a tensor dtype"):
        Plan.from_json(json.dumps(data))


def test_absurd_shapes_and_numbers_are_refused() -> None:
    for shape in ([2**41, 1], [2**30, 2**30, 2**30], [1] * 17):
        data = copy.deepcopy(BASE)
        data["model"]["inputs"][0]["shape"] = shape
        with pytest.raises(PlanError, match=r"model.inputs\[0\].shape"):
            Plan.from_json(json.dumps(data))
    text = json.dumps(BASE).replace(f'"budget_bytes": {BASE["budget_bytes"]}', '"budget_bytes": ' + "9" * 5000)
    with pytest.raises(PlanError, match="too long"):
        Plan.from_json(text)
    data = copy.deepcopy(BASE)
    data["budget_bytes"] = 2**64
    with pytest.raises(PlanError, match="budget_bytes: a 20-digit integer"):
        Plan.from_json(json.dumps(data))


def test_mesh_axis_names_must_name_every_axis() -> None:
    """An empty list would load as the default names, not what the file says (found by the slow fuzz run)."""
    for names in ([], ["x"], ["x", "y", "z", "w"]):
        data = copy.deepcopy(BASE)
        data["mesh"]["axis_names"] = names
        with pytest.raises(PlanError, match=rf"mesh.axis_names: {len(names)} names for the 3 axes"):
            Plan.from_json(json.dumps(data))


@DEFAULT
@given(mutated_texts())
def test_mutated_plans_load_equal_or_are_refused(text: str) -> None:
    _check(text)


@pytest.mark.slow
@MANY
@given(mutated_texts())
def test_mutated_plans_load_equal_or_are_refused_many(text: str) -> None:
    _check(text)
