"""Capture path 1: torch.fx symbolic tracing, then shape propagation on fake or meta tensors.

The tracer keeps the layers the cost model prices as leaf modules (the module types the op families name,
`cost_models.family`: nn.Linear, nn.Embedding, nn.LayerNorm, nn.Dropout, the usual activations, HF's
Conv1D) and traces through everything else, so a model's own
functional code (attention written with `@`, `softmax`, `masked_fill`) shows up op by op. Shapes come from
running the traced graph once with an interpreter on meta tensors (when the model lives on the meta
device) or under `FakeTensorMode` (otherwise): no real memory is allocated and nothing is computed.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from cost_models.calls import Call, Param
from cost_models.family import classify_module, is_leaf_module
from planner.trace.common import (
    OpBuilder,
    PathFailure,
    canonical_names,
    describe_node,
    dtype_name,
    first_line,
    source_line,
    where,
)
from planner.trace.opaque import module_opaque_attrs
from planner.trace.patterns import fuse_rms_norm

__all__ = ["PlannerTracer", "capture_fx", "aten_op_name"]


# Python operators -> canonical op names (operator.truediv is "div", in-place forms are their op).
_OPERATORS = {"truediv": "div", "itruediv": "div", "floordiv": "floor_divide", "ifloordiv": "floor_divide",
              "iadd": "add", "isub": "sub", "imul": "mul", "and_": "and", "or_": "or", "xor": "xor",
              "not_": "not", "invert": "bitwise_not", "imatmul": "matmul", "mod": "remainder"}
# Torch-level aliases -> canonical op names.
_ALIASES = {"true_divide": "div", "divide": "div", "multiply": "mul", "subtract": "sub", "__and__": "and", "__or__": "or", "__xor__": "xor", "__invert__": "bitwise_not", "greater": "gt",
            "less": "lt", "greater_equal": "ge", "less_equal": "le", "not_equal": "ne"}


class PlannerTracer(fx.Tracer):
    """`fx.Tracer` whose leaves are the layers the cost model knows, plus torch.nn modules with parameters
    it does not know (kept whole as "other" ops); buffers become `get_attr` nodes. With `stack_traces`
    each node records the source line that created it (slow: only used to explain a failure)."""

    proxy_buffer_attributes = True

    def __init__(self, stack_traces: bool = False) -> None:
        super().__init__()
        self.record_stack_traces = stack_traces

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if is_leaf_module(m):
            return True
        if isinstance(m, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            return False
        own_params = next(m.parameters(recurse=False), None) is not None
        return type(m).__module__.startswith("torch.nn") and own_params


def aten_op_name(op: torch._ops.OpOverload) -> tuple[str, str]:
    """(canonical name, readable target) of an ATen op: aten.add.Tensor -> ("add", "aten.add.Tensor")."""
    name = op._schema.name.split("::")[-1]
    overload = op._overloadname
    text = f"aten.{name}" + ("" if overload == "default" else f".{overload}")
    name = name.rstrip("_") if name.endswith("_") and not name.startswith("_") else name
    return _ALIASES.get(name, name), text


def _function_name(fn: Callable[..., Any]) -> tuple[str, str]:
    if isinstance(fn, torch._ops.OpOverload):
        return aten_op_name(fn)
    name = getattr(fn, "__name__", str(fn))
    if fn is getattr(operator, name, None):
        return _OPERATORS.get(name, name), f"operator.{name}"
    if fn is getattr(F, name, None):
        return _ALIASES.get(name, name), f"F.{name}"
    if fn is getattr(torch, name, None):
        return _ALIASES.get(name, name), f"torch.{name}"
    return _ALIASES.get(name, name), f"{getattr(fn, '__module__', '?')}.{name}"


def _method_name(name: str) -> str:
    if name.endswith("_") and not name.startswith("_"):
        name = name[:-1]  # x.add_(y) is an add
    return _ALIASES.get(name, name)


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    return list(stack.values())[-1][0] if stack else ""


def _module_target(m: nn.Module) -> str:
    cls = type(m)
    if cls.__module__.startswith("torch.nn"):
        return f"nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _module_classifier(m: nn.Module) -> Callable[[Call], tuple[str, dict[str, Any]]]:
    """(kind, attrs) of a call of leaf module `m`, read from the module itself by its op family."""
    return lambda call: classify_module(m)


class _ShapeProp(fx.Interpreter):
    """Runs the graph once, keeping every node's value (fake/meta tensors, concrete Python values).

    Placeholders are fed by name: `inputs` for the traced arguments, `concrete` for the arguments traced
    as constants (FX makes one placeholder `{name}_{k}` per leaf of such a value)."""

    def __init__(self, gm: fx.GraphModule, inputs: dict[str, Any], concrete: dict[str, Any]) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.inputs, self.concrete = inputs, concrete
        self.values: dict[str, Any] = {}

    def placeholder(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if target in self.inputs:
            return self.inputs[target]
        base, _, k = str(target).rpartition("_")
        if base in self.concrete and k.isdigit():
            return pytree.tree_leaves(self.concrete[base])[int(k) - 1]
        return args[0] if args else None

    def run_node(self, n: fx.Node) -> Any:
        try:
            value = super().run_node(n)
        except Exception as e:
            raise _NodeFailure(n.name, describe_node(n), e) from e
        self.values[n.name] = value
        return value


class _NodeFailure(Exception):
    def __init__(self, name: str, text: str, error: Exception) -> None:
        super().__init__(name)
        self.name, self.text, self.error = name, text, error


def _source_line(model: nn.Module, concrete: dict[str, Any], node_name: str) -> str:
    """Trace again recording stack traces and return the source line that created node `node_name`."""
    return source_line(PlannerTracer(stack_traces=True).trace(model, concrete_args=concrete or None), node_name)


def _trace(model: nn.Module, concrete: dict[str, Any]) -> fx.GraphModule:
    tracer = PlannerTracer()
    try:
        graph = tracer.trace(model, concrete_args=concrete or None)
    except Exception as e:
        raise PathFailure("fx", where(e) or "symbolic_trace", first_line(e)) from e
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    fuse_rms_norm(gm, lambda n: _param_shape(gm, n), aten=False)
    return gm


def _param_shape(gm: fx.GraphModule, node: fx.Node) -> tuple[int, ...] | None:
    """The shape of the parameter a get_attr node reads, else None."""
    if node.op != "get_attr":
        return None
    try:
        p = gm.get_parameter(str(node.target))
    except AttributeError:
        return None
    return tuple(p.shape)


def capture_fx(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, on_meta: bool,
               device: torch.device) -> tuple[OpBuilder, fx.GraphModule]:
    """Trace `model` and build its ops; raises PathFailure when tracing or shape propagation fails.

    Tensor arguments are traced; every other argument, and every forward parameter left out, is traced
    as a constant (its value, or its default)."""
    sig = inspect.signature(model.forward)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise PathFailure("fx", "forward signature", f"the example inputs do not fit forward{sig}: {e}") from e
    tensors: dict[str, torch.Tensor] = {}
    concrete: dict[str, Any] = {}
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            if bound.arguments.get(name):
                raise PathFailure("fx", "forward signature", f"symbolic tracing cannot pass *{name} arguments")
            continue
        value = bound.arguments.get(name, p.default)
        if value is inspect.Parameter.empty:
            raise PathFailure("fx", "forward signature", f"no example input for forward argument {name!r}")
        if isinstance(value, torch.Tensor):
            tensors[name] = value
        else:
            concrete[name] = value
    gm = _trace(model, concrete)

    mode = None if on_meta else FakeTensorMode(allow_non_fake_inputs=True)

    def shadow(v: torch.Tensor) -> torch.Tensor:  # same shape and dtype, no data
        if mode is None:
            return torch.empty(v.shape, dtype=v.dtype, device="meta")
        with mode:
            return torch.empty(v.shape, dtype=v.dtype, device=device)

    interp = _ShapeProp(gm, {k: shadow(v) for k, v in tensors.items()}, concrete)
    try:
        with torch.no_grad(), (mode if mode is not None else contextlib.nullcontext()):
            interp.run()
    except _NodeFailure as f:
        src = _source_line(model, concrete, f.name)
        raise PathFailure("fx", f.text + (f", {src}" if src else ""), first_line(f.error)) from f.error
    return _build(model, gm, interp.values), gm


def _build(model: nn.Module, gm: fx.GraphModule, values: dict[str, Any]) -> OpBuilder:
    names = canonical_names(model)
    b = OpBuilder()
    for node in gm.graph.nodes:
        value = values.get(node.name)
        if node.op == "placeholder":
            if isinstance(value, torch.Tensor):
                b.add_leaf(node, "input", str(node.target), value)
            else:
                b.add_value(node, value)
        elif node.op == "get_attr":
            _get_attr(b, gm, node, value, names)
        elif node.op == "call_module":
            mod = gm.get_submodule(str(node.target))
            params = [Param(names.get(id(p), f"{node.target}.{n}"), tuple(p.shape), dtype_name(p.dtype))
                      for n, p in mod.named_parameters()]
            holds = bool(params) or next(mod.buffers(), None) is not None
            b.add_call(node, type(mod).__name__, "torch", _module_target(mod), value, str(node.target),
                       module_classify=_module_classifier(mod), module_params=params,
                       module_opaque=_opaque_facts(mod, node, values) if holds else None)
        elif node.op == "call_method":
            b.add_call(node, _method_name(str(node.target)), "torch", str(node.target), value, _module_path(node))
        elif node.op == "call_function":
            if node.target is getattr:  # x.T, x.mT, x.device, x.shape
                op, text = str(node.args[1]), f"getattr.{node.args[1]}"
            else:
                op, text = _function_name(node.target)  # type: ignore[arg-type]
            level = "aten" if isinstance(node.target, torch._ops.OpOverload) else "torch"
            b.add_call(node, op, level, text, value, _module_path(node))
        elif node.op == "output":
            b.add_output(node)
    return b


def _opaque_facts(mod: nn.Module, node: fx.Node, values: dict[str, Any]) -> Callable[[Call], dict[str, Any]]:
    """The opaque-op facts of a call of leaf module `mod` (`planner.trace.opaque`), from the traced values
    of its arguments."""
    def value(a: Any) -> Any:
        return values.get(a.name) if isinstance(a, fx.Node) else a

    def facts(call: Call) -> dict[str, Any]:
        args = fx.node.map_aggregate(node.args, value)
        kwargs = fx.node.map_aggregate(node.kwargs, value)
        inputs = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        return module_opaque_attrs(mod, tuple(args), dict(kwargs), call.in_meta, call.outputs, inputs)

    return facts


def _get_attr(b: OpBuilder, gm: fx.GraphModule, node: fx.Node, value: Any, names: dict[int, str]) -> None:
    attr = gm
    for part in str(node.target).split("."):
        attr = getattr(attr, part)
    if isinstance(attr, nn.Parameter):
        b.add_param(node, names.get(id(attr), str(node.target)), attr)
    elif isinstance(attr, torch.Tensor):
        name = names.get(id(attr))
        owner = name.rsplit(".", 1)[0] if name and "." in name else ""
        attrs = {"buffer": name} if name else {"constant": str(node.target)}
        b.add_leaf(node, "other", "get_attr", value if isinstance(value, torch.Tensor) else attr, owner, attrs)
    else:
        b.add_value(node, value)
