"""What every node of a captured FX graph computes globally, and how its arguments map to an OpNode's inputs.

The rewrite needs, for each FX node, whether it is an activation (an `OpNode`), a parameter (or a
transposed/cast view of one), a shape computation whose *global* value can be folded into its users
(`x.size(1)`, `T // n_head`), or a value that must stay computed at run time (`x.device`). Global values
come from the capture itself (`node.meta["val"]` on exported graphs) or from running the graph once on
fake tensors of the traced shapes (symbolically traced graphs), without allocating or computing anything.

`activation_args` walks a node's arguments in exactly the order `planner.trace.common.OpBuilder` used
to number the op's inputs, so argument k of the walk is `OpNode.inputs[k]` and is laid out as
`Assignment.inputs[k]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from cost_models.errors import PlannerError
from planner.trace.common import TORCH_DTYPES
from planner.trace.graph import ModelGraph

__all__ = ["ApplyError", "ParamRef", "NodeValues", "node_values", "is_foldable", "map_aggregate", "op_name", "activation_args"]


class ApplyError(PlannerError, ValueError):
    """A plan that cannot be applied to this model, or a graph the rewrite does not support: says what
    and how to fix it."""


@dataclass(frozen=True)
class ParamRef:
    """A parameter argument: its state-dict name; `transposed` when the node is a transposed view."""

    name: str
    transposed: bool = False


def is_foldable(value: Any) -> bool:
    """True for values that are the same on every rank and can be written into the graph as constants:
    numbers, strings, None, dtypes, sizes and containers of them (not devices, not tensors)."""
    if isinstance(value, torch.device | torch.Tensor):
        return False
    leaves = pytree.tree_leaves(value)
    return all(v is None or isinstance(v, bool | int | float | str | torch.dtype | slice | type(Ellipsis))
               for v in leaves)


def map_aggregate(a: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply `fn` to every leaf of `a` (tuples, lists, dicts and slices are walked), keeping containers."""
    if isinstance(a, tuple):
        mapped = [map_aggregate(x, fn) for x in a]
        return type(a)(*mapped) if hasattr(a, "_fields") else tuple(mapped)
    if isinstance(a, list):
        return [map_aggregate(x, fn) for x in a]
    if isinstance(a, dict):
        return {k: map_aggregate(v, fn) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(map_aggregate(a.start, fn), map_aggregate(a.stop, fn), map_aggregate(a.step, fn))
    return fn(a)


def op_name(node: fx.Node) -> str:
    """Canonical op name of a call node: method name, function name, or ATen op name ("view", "split")."""
    t = node.target
    if node.op == "call_method":
        return str(t).rstrip("_") if str(t).endswith("_") and not str(t).startswith("_") else str(t)
    if isinstance(t, torch._ops.OpOverload):
        return t._schema.name.split("::")[-1]
    return getattr(t, "__name__", str(t))


@dataclass
class NodeValues:
    """Per FX node name: `values` (global value: fake tensor, number, size...), `params` (parameter
    arguments and views of them), `folded` (shape computations and other constants to substitute)."""

    values: dict[str, Any]
    params: dict[str, ParamRef]
    folded: dict[str, Any]


def _meta(meta: Any) -> torch.Tensor:
    return torch.empty(meta.shape, dtype=TORCH_DTYPES[meta.dtype], device="meta")


class _Eval(fx.Interpreter):
    """Evaluates only what the ops do not already say: every op's value is a meta tensor of its captured
    output shape, and the remaining nodes (sizes, shape arithmetic, parameter views) run on those."""

    def __init__(self, graph: ModelGraph, model: nn.Module) -> None:
        super().__init__(graph.gm, garbage_collect_values=False)
        self.ops = {n.name: n for n in graph.nodes}
        self.params = dict(model.named_parameters())
        self.values: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        op = self.ops.get(n.name)
        if op is not None and op.kind != "output":
            outs = [_meta(m) for m in op.outputs]
            value: Any = outs[0] if len(outs) == 1 else outs
        elif n.op == "placeholder":
            value = n.args[0] if n.args else None
        elif n.op == "get_attr" and str(n.target) in self.params:
            value = torch.empty_like(self.params[str(n.target)], device="meta")
        else:
            value = super().run_node(n)
        self.values[n.name] = value
        return value


def _eval_values(graph: ModelGraph, model: nn.Module) -> dict[str, Any]:
    """Every node's global value by name: recorded by torch.export (node.meta["val"]), else worked out
    on meta tensors from the captured shapes (nothing is allocated or computed)."""
    gm = graph.gm
    if all("val" in n.meta for n in gm.graph.nodes if n.op not in ("output",)):
        return {n.name: n.meta["val"] for n in gm.graph.nodes if n.op != "output"}
    interp = _Eval(graph, model)
    with torch.no_grad():
        interp.run()
    return interp.values


def node_values(graph: ModelGraph, model: nn.Module) -> NodeValues:
    """Classify every FX node of `graph.gm` (see the module docstring)."""
    gm = graph.gm
    values = _eval_values(graph, model)
    ops = {n.name for n in graph.nodes}
    params: dict[str, ParamRef] = {}
    folded: dict[str, Any] = {}
    names = {id(t): n for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    program = getattr(graph, "program", None)
    lifted = program.graph_signature.inputs_to_parameters if program is not None else {}
    canonical = dict(model.named_parameters(remove_duplicate=False))
    for node in gm.graph.nodes:
        if node.op == "output" or node.name in ops:
            continue
        value = values.get(node.name)
        if node.op == "placeholder" and node.name in lifted:
            p = canonical.get(lifted[node.name])
            params[node.name] = ParamRef(names.get(id(p), lifted[node.name]) if p is not None else lifted[node.name])
        elif node.op == "get_attr" and isinstance(_attr(gm, str(node.target)), nn.Parameter):
            params[node.name] = ParamRef(names.get(id(_attr(gm, str(node.target))), str(node.target)))
        elif isinstance(value, torch.Tensor):
            srcs = [a for a in node.all_input_nodes if a.name in params]
            if len(srcs) == 1 and all(a.name in params or a.name in folded for a in node.all_input_nodes):
                base = params[srcs[0].name]
                params[node.name] = ParamRef(base.name, base.transposed ^ _flips(node, values))
        elif is_foldable(value):
            folded[node.name] = value
    return NodeValues(values, params, folded)


def _attr(gm: nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _flips(node: fx.Node, values: dict[str, Any]) -> bool:
    """Whether a view of a 2-D parameter swaps its dims (W.t(), W.transpose(0, 1), aten.t, permute(1, 0))."""
    name = op_name(node)
    if name in ("t", "T", "mT", "numpy_T"):
        return True
    args = [values.get(a.name, a) if isinstance(a, fx.Node) else a for a in node.args[1:]]
    if name in ("transpose", "swapaxes", "swapdims") and len(args) == 2:
        return int(args[0]) % 2 != int(args[1]) % 2
    if name == "permute":
        dims = [int(d) % 2 for d in pytree.tree_leaves(args)]
        return dims == [1, 0]
    return False


def activation_args(node: fx.Node, ops: set[str], multi: dict[str, int],
                    fn: Callable[[fx.Node, int | None], Any], other: Callable[[fx.Node], Any]) -> tuple[tuple, dict]:
    """Rebuild `node`'s (args, kwargs), calling `fn(producer, output_index)` for each activation argument
    in OpBuilder's input order and `other(n)` for every other node argument.

    `multi` maps multi-output producers to their number of outputs: a getitem reads one of them
    (`output_index` = the getitem's index), any other consumer reads all of them (a tuple of calls).
    """
    getitem = op_name(node) == "getitem" if node.op == "call_function" else False

    def conv(a: Any) -> Any:
        if isinstance(a, fx.Node):
            if a.name not in ops:
                return other(a)
            n_out = multi.get(a.name, 1)
            if n_out == 1:
                return fn(a, None)
            if getitem:
                return fn(a, int(node.args[1]))
            return tuple(fn(a, i) for i in range(n_out))
        if isinstance(a, list | tuple | dict | slice):
            return map_aggregate(a, conv)
        return a

    args = tuple(conv(a) for a in node.args)
    kwargs = {k: conv(v) for k, v in node.kwargs.items()}
    return args, kwargs
