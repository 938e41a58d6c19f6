"""Typed JSON for the plan dataclasses: writing by type hints, reading with checks that name the field.

`to_data` turns a dataclass (with `Layout` and `Mesh` fields, lists, dicts, optional values) into JSON data;
`JsonReader` turns JSON data back, checking every type, refusing negative numbers, missing and unknown
keys, and layouts that use axes the mesh does not have. `format_json` writes the data deterministically.
Errors are `PlanError`s whose message starts with the field's path (`assignments[3].cost.saved_bytes`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import types
from json.encoder import encode_basestring_ascii
from typing import Any, Union, get_args, get_origin, get_type_hints

from cost_models.errors import PlannerError
from cost_models.layout import Layout, LayoutError
from cost_models.mesh import Mesh, MeshError

__all__ = ["PlanError", "REPLAN", "to_data", "format_json", "JsonReader", "read_mesh", "describe"]

REPLAN = "re-run `planner plan` to write a new plan"
MAX_INT = 2**63 - 1  # the largest integer a plan field holds (bytes, counts): an int64


class PlanError(PlannerError, ValueError):
    """A plan that cannot be read or written: names the field that is wrong and how to fix it."""


@functools.cache
def _shape(hint: Any) -> tuple[str, Any]:
    """How a type hint is written and read, worked out once per hint: ("optional", X) for X | None,
    ("list", X), ("dict", X) for dict[str, X], ("dataclass", field types by name), or ("leaf", hint)
    (Layout and Mesh are leaves: they have their own JSON form)."""
    if hint in (Layout, Mesh):
        return "leaf", hint
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return "optional", next(a for a in get_args(hint) if a is not type(None))
    if origin is list:
        return "list", get_args(hint)[0]
    if origin is dict:
        return "dict", get_args(hint)[1]
    if dataclasses.is_dataclass(hint):
        hints = get_type_hints(hint)  # resolves the string annotations: slow, hence the cache
        return "dataclass", {f.name: hints[f.name] for f in dataclasses.fields(hint)}
    return "leaf", hint


def to_data(value: Any, hint: Any, path: str) -> Any:
    """`value` as JSON data, following the type hint (tuples become lists, numpy numbers plain ones)."""
    kind, inner = _shape(hint)
    if kind == "optional":
        if value is None or (inner is float and isinstance(value, numbers.Real) and not math.isfinite(value)):
            return None
        return to_data(value, inner, path)
    if kind == "list":
        return [to_data(v, inner, f"{path}[{i}]") for i, v in enumerate(value)]
    if kind == "dict":
        return {str(k): to_data(v, inner, _join(path, str(k))) for k, v in value.items()}
    if kind == "dataclass":
        return {name: to_data(getattr(value, name), h, _join(path, name)) for name, h in inner.items()}
    if hint in (Layout, Mesh):
        return value.to_json()
    return _plain(value, path)


def _plain(value: Any, path: str) -> Any:
    """Free-form JSON data (options, hardware numbers): tuples to lists, numpy scalars to Python ones."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        if not math.isfinite(value):
            raise PlanError(f"{path}: {value} is not a finite number and cannot be written to a plan")
        return float(value)
    if isinstance(value, list | tuple):
        return [_plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _plain(v, _join(path, str(k))) for k, v in value.items()}
    raise PlanError(f"{path}: a {type(value).__name__} cannot be written to a plan (JSON data only)")


def format_json(data: Any) -> str:
    """Indented JSON with sorted keys where a short container (a layout, a cost) stays on one line, so
    plans read and diff line by line; scalars are written by json.dumps (floats by repr)."""
    return _render(data, 0)[1]


def _render(data: Any, level: int) -> tuple[str, str]:
    """(one-line form, indented form) of `data`; each subtree is encoded once, its one-line form reused."""
    if not isinstance(data, dict | list) or not data:
        flat = _scalar(data)
        return flat, flat
    if isinstance(data, list):
        keys, parts = [""] * len(data), [_render(v, level + 1) for v in data]
        opening, closing = "[", "]"
    else:
        ordered = sorted(data)
        keys = [encode_basestring_ascii(k) + ": " for k in ordered]
        parts = [_render(data[k], level + 1) for k in ordered]
        opening, closing = "{", "}"
    flat = opening + ", ".join(k + one for k, (one, _) in zip(keys, parts)) + closing
    if len(flat) + 2 * level <= 110:
        return flat, flat
    pad = "  " * (level + 1)
    body = ",\n".join(pad + k + indented for k, (_, indented) in zip(keys, parts))
    return flat, opening + "\n" + body + "\n" + "  " * level + closing


def _scalar(value: Any) -> str:
    """A JSON scalar (or empty container) exactly as json.dumps writes it, without its per-call overhead."""
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} cannot be written to strict JSON")
        return float.__repr__(value)
    return json.dumps(value, allow_nan=False)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def describe(value: Any) -> str:
    """What kind of JSON value `value` is, for error messages ("a string", "null")."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


# --- reading -----------------------------------------------------------------------------------

def read_mesh(data: Any, path: str) -> Mesh:
    """The Mesh in `data` (Mesh.to_json's form), with every key and type checked."""
    if not isinstance(data, dict) or set(data) != {"shape", "axis_names", "ranks_per_node"}:
        raise PlanError(f"{path}: expected an object with keys axis_names, ranks_per_node, shape; "
                        f"got {data if not isinstance(data, dict) else sorted(data)!r}; {REPLAN}")
    shape, names, per_node = data["shape"], data["axis_names"], data["ranks_per_node"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
        raise PlanError(f"{path}.shape: expected a list of integers, got {shape!r}; {REPLAN}")
    if not isinstance(names, list) or not all(isinstance(a, str) for a in names):
        raise PlanError(f"{path}.axis_names: expected a list of strings, got {names!r}; {REPLAN}")
    if len(names) != len(shape):  # Mesh would fill an empty list with default names: not what the file says
        raise PlanError(f"{path}.axis_names: {len(names)} names for the {len(shape)} axes of shape {shape}; one "
                        f"name per axis; {REPLAN}")
    if not isinstance(per_node, int) or isinstance(per_node, bool):
        raise PlanError(f"{path}.ranks_per_node: expected an integer, got {per_node!r}; {REPLAN}")
    try:
        return Mesh(tuple(shape), tuple(names), per_node)
    except MeshError as e:
        raise PlanError(f"{path}: {e}; {REPLAN}") from None


class JsonReader:
    """Turns JSON data into plan dataclasses by their type hints, checking types, signs and layouts."""

    def __init__(self, mesh: Mesh | None) -> None:
        self.mesh = mesh

    def value(self, data: Any, hint: Any, path: str) -> Any:
        kind, inner = _shape(hint)
        if kind == "optional":
            return None if data is None else self.value(data, inner, path)
        if kind == "list":
            self._expect(isinstance(data, list), "a list", data, path)
            return [self.value(v, inner, f"{path}[{i}]") for i, v in enumerate(data)]
        if kind == "dict":
            self._expect(isinstance(data, dict), "an object", data, path)
            return {k: self.value(v, inner, _join(path, k)) for k, v in data.items()}
        if kind == "dataclass":
            return self.dataclass(hint, data, path)
        if hint is Mesh:
            return self.mesh if self.mesh is not None else read_mesh(data, path)
        if hint is Layout:
            return self.layout(data, path)
        if hint is Any:
            return data
        if hint is bool:
            self._expect(isinstance(data, bool), "true or false", data, path)
            return data
        if hint is str:
            self._expect(isinstance(data, str), "a string", data, path)
            return data
        if hint is int:
            self._expect(isinstance(data, int) and not isinstance(data, bool), "an integer", data, path)
            if data > MAX_INT:
                raise PlanError(f"{path}: a {len(str(data))}-digit integer is larger than any count a plan holds "
                                f"(at most 2**63 - 1); {REPLAN}")
        elif hint is float:
            self._expect(isinstance(data, int | float) and not isinstance(data, bool), "a number", data, path)
            try:
                data = float(data)
            except OverflowError:
                data = math.inf
            if not math.isfinite(data):
                raise PlanError(f"{path}: {data} is not a finite number; {REPLAN}")
        else:
            raise AssertionError(f"no reader for type {hint!r} at {path}")
        if data < 0:
            raise PlanError(f"{path}: must not be negative, got {data}; {REPLAN}")
        return data

    def dataclass(self, cls: Any, data: Any, path: str) -> Any:
        self._expect(isinstance(data, dict), "an object", data, path)
        hints = _shape(cls)[1]
        names = list(hints)
        # a field with a default may be absent (plans written before the field existed)
        optional = {f.name for f in dataclasses.fields(cls)
                    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
        missing = [n for n in names if n not in data and n not in optional]
        if missing:
            raise PlanError(f"missing key {missing[0]!r} in {path or 'the top level'}; {REPLAN}")
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise PlanError(f"unknown key {unknown[0]!r} in {path or 'the top level'} (the keys there are "
                            f"{', '.join(sorted(names))}); {REPLAN}")
        return cls(**{n: self.value(data[n], h, _join(path, n)) for n, h in hints.items() if n in data})

    def layout(self, data: Any, path: str) -> Layout:
        self._expect(isinstance(data, dict), "a layout object", data, path)
        extra = sorted(set(data) - {"dims", "partial", "interleave"})
        dims, partial, interleave = data.get("dims"), data.get("partial", []), data.get("interleave", 1)
        ok = (not extra and isinstance(dims, list) and all(isinstance(d, list) for d in dims)
              and all(isinstance(a, str) for d in dims for a in d) and isinstance(partial, list)
              and all(isinstance(a, str) for a in partial) and isinstance(interleave, int)
              and not isinstance(interleave, bool))
        if not ok:
            raise PlanError(f"{path}: malformed layout {data!r} (expected {{\"dims\": [[axes], ...], "
                            f"\"partial\": [axes], \"interleave\": n}}); {REPLAN}")
        try:
            layout = Layout.from_json(data)
        except LayoutError as e:
            raise PlanError(f"{path}: {e}; {REPLAN}") from None
        if self.mesh is not None:
            unknown = [a for a in layout.axes() + layout.partial if a not in self.mesh.axis_names]
            if unknown:
                raise PlanError(f"{path}: layout {layout} uses mesh axis {unknown[0]!r}, but the plan's mesh "
                                f"{self.mesh} has axes {', '.join(self.mesh.axis_names)}; {REPLAN}")
        return layout

    @staticmethod
    def _expect(ok: bool, what: str, data: Any, path: str) -> None:
        if not ok:
            raise PlanError(f"{path or 'plan'}: expected {what}, got {describe(data)}; {REPLAN}")
