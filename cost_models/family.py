"""Op families, each registered once: what capture recognises, how the cost model prices it.

One decorated definition per family, in its strategy file (`cost_models/strategies/<family>.py`):

    @op_family("layer_norm", ops=("layer_norm", "native_layer_norm"), classify=_layer_norm_call,
               modules=("torch.nn.modules.normalization.LayerNorm",), module_attrs=_layer_norm_module,
               flops_per_elem=8, in_map=True)
    def layer_norm_rule(op, mesh, candidates, device): ...

carries
* the kind (`OpNode.kind`; the op kinds are the registered families, see `op_kinds`);
* the capture patterns: canonical op names (`ops`, the same at torch and ATen level, see
  `cost_models.calls`) with a classifier `Call -> attrs | None` (None: "not this family", so two families
  may claim one name, e.g. `matmul` of two activations vs. of an activation and a weight; their
  classifiers must then be mutually exclusive), and leaf module types named by qualified class name
  strings (`modules`, so cost_models needs no torch) with `module_attrs(module) -> attrs` reading the
  module duck-typed;
* the strategy rule (the decorated function), the FLOPs per element of a memory-bound family, and
  whether the family's ops show in the scheme map (`in_map`);
* whether its rule prices the parameters its ops hold (`prices_params`). An op holding parameters (or a
  leaf module holding buffers) whose family does not is captured as an `opaque` op instead
  (`cost_models/strategies/opaque.py`: run whole, every parameter and buffer counted), so nothing a model
  holds falls out of the memory model.

The runtime half of a family that needs a parallel layer is registered by kind in `layers3d` (see
`layers3d.builders`); families that run in their input's layout need none.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cost_models.calls import Call, plain

__all__ = ["OpFamily", "FamilyError", "op_family", "families", "family", "op_kinds", "classify_call",
           "module_family", "is_leaf_module", "classify_module", "flops_per_elem", "map_kinds", "prices_params",
           "CORE_KINDS", "OPAQUE"]

Attrs = dict[str, Any]
Classifier = Callable[[Call], "Attrs | None"]
ModuleAttrs = Callable[[Any], Attrs]
Rule = Callable[..., Iterator[Any]]  # (op, mesh, candidates, device) -> offers and reasons (strategies.base)

# Kinds the planner itself relies on: graph inputs and outputs, the fallback for anything unknown, and the
# fallback for anything unknown that holds parameters or buffers (run whole, its states counted).
OPAQUE = "opaque"
CORE_KINDS = ("input", "output", "other", OPAQUE)


class FamilyError(Exception):
    """An op family registered twice, or two families claiming one module type: a bug in the code that
    registers them (not a user error, so not a PlannerError)."""


@dataclass(frozen=True)
class OpFamily:
    """One op family (see the module docstring)."""

    kind: str
    rule: Rule
    ops: tuple[str, ...] = ()
    classify: Classifier | None = None
    modules: tuple[str, ...] = ()
    module_attrs: ModuleAttrs | None = None
    flops_per_elem: int = 1
    in_map: bool = False
    prices_params: bool = False

    def call_attrs(self, call: Call) -> Attrs | None:
        """The attrs of `call` if it is an op of this family, else None."""
        if self.classify is None:
            return {}
        return self.classify(call)


_FAMILIES: dict[str, OpFamily] = {}
_BY_OP: dict[str, list[OpFamily]] = {}
_BY_MODULE: dict[str, OpFamily] = {}
_loaded = False


def op_family(kind: str, *, ops: tuple[str, ...] = (), classify: Classifier | None = None,
              modules: tuple[str, ...] = (), module_attrs: ModuleAttrs | None = None, flops_per_elem: int = 1,
              in_map: bool = False, prices_params: bool = False) -> Callable[[Rule], Rule]:
    """Decorator: register the op family `kind` whose strategy rule is the decorated function."""
    if not kind.isidentifier():
        raise FamilyError(f"op kind {kind!r} must be an identifier")
    if modules and module_attrs is None:
        raise FamilyError(f"op family {kind!r} names module types {modules} but no module_attrs to read them")

    def deco(rule: Rule) -> Rule:
        if kind in _FAMILIES:
            raise FamilyError(f"op kind {kind!r} already registered (rule {_FAMILIES[kind].rule.__name__})")
        for m in modules:
            if m in _BY_MODULE:
                raise FamilyError(f"module type {m} already belongs to op family {_BY_MODULE[m].kind!r}")
        fam = OpFamily(kind, rule, tuple(ops), classify, tuple(modules), module_attrs, flops_per_elem, in_map,
                       prices_params)
        _FAMILIES[kind] = fam
        for name in fam.ops:
            _BY_OP.setdefault(name, []).append(fam)
        for m in fam.modules:
            _BY_MODULE[m] = fam
        return rule
    return deco


def _ensure_loaded() -> None:
    """Import the strategies package once: its modules register the families as they load."""
    global _loaded
    if not _loaded:
        importlib.import_module("cost_models.strategies")
        _loaded = True


def families() -> tuple[OpFamily, ...]:
    """Every registered family, by kind name."""
    _ensure_loaded()
    return tuple(_FAMILIES[k] for k in sorted(_FAMILIES))


def family(kind: str) -> OpFamily | None:
    _ensure_loaded()
    return _FAMILIES.get(kind)


def op_kinds() -> tuple[str, ...]:
    """The op kinds capture can produce and the cost model prices: the registered families."""
    return tuple(f.kind for f in families())


def flops_per_elem(kind: str) -> int:
    """FLOPs per element of a memory-bound family (1 for a kind without a family)."""
    fam = family(kind)
    return fam.flops_per_elem if fam is not None else 1


def prices_params(kind: str) -> bool:
    """Whether the rule of `kind` prices the parameters its ops hold (see the module docstring)."""
    fam = family(kind)
    return fam is not None and fam.prices_params


def map_kinds() -> tuple[str, ...]:
    """The kinds whose ops the scheme map shows (the ops whose scheme is a real choice)."""
    return tuple(f.kind for f in families() if f.in_map)


def classify_call(call: Call) -> tuple[str, Attrs]:
    """(kind, attrs) of a traced call: the first family claiming its op name whose classifier accepts it;
    ("other", {}) when none does."""
    _ensure_loaded()
    for fam in _BY_OP.get(call.op, ()):
        attrs = fam.call_attrs(call)
        if attrs is not None:
            return fam.kind, {k: plain(v) for k, v in attrs.items()}
    return "other", {}


def _class_names(module: Any) -> Iterator[tuple[str, type]]:
    for cls in type(module).__mro__:
        yield f"{cls.__module__}.{cls.__qualname__}", cls


def module_family(module: Any) -> OpFamily | None:
    """The family of a module whose type (or a base type) a family names, most derived first."""
    _ensure_loaded()
    for name, _ in _class_names(module):
        if name in _BY_MODULE:
            return _BY_MODULE[name]
    return None


def is_leaf_module(module: Any) -> bool:
    """Whether capture keeps `module` whole: its type, or a base type a family names whose forward it
    does not override."""
    _ensure_loaded()
    return any(name in _BY_MODULE and type(module).forward is cls.forward for name, cls in _class_names(module))


def classify_module(module: Any) -> tuple[str, Attrs]:
    """(kind, attrs) of a call of leaf module `module`, read from the module itself."""
    fam = module_family(module)
    if fam is None or fam.module_attrs is None:
        return "other", {}
    return fam.kind, {k: plain(v) for k, v in fam.module_attrs(module).items()}
