"""Capture path 2: torch.export, for models symbolic tracing cannot handle (HF transformers models, code
that reads tensor shapes in Python control flow).

torch.export traces with fake tensors, so it computes nothing and allocates no parameter memory; a model on
the meta device exports with meta inputs. The exported graph is at ATen level: `aten.linear`,
`aten.addmm(bias, x, W)` (HF Conv1D: a linear whose weight is stored [in, out]), `aten.layer_norm`,
`aten.softmax`... Parameters are placeholders that the graph signature maps to state_dict names; each
node's `nn_module_stack` says which module it ran in.
"""

from __future__ import annotations

import contextlib
import io
import logging
import operator
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from planner.trace.common import (
    OpBuilder,
    PathFailure,
    SymbolicShapeError,
    canonical_names,
    describe_node,
    first_line,
    source_line,
    where,
    where_in_stack,
)
from planner.trace.fx import aten_op_name
from planner.trace.patterns import fuse_rms_norm

__all__ = ["capture_export"]

# Loggers that print guard diagnostics when export fails (and export prints the partial graph to stderr);
# capture reports failures itself, in one message.
_NOISY_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch._export", "torch.export",
                  "torch._dynamo", "torch._functorch", "torch.fx.experimental.proxy_tensor")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in _NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    return list(stack.values())[-1][0] if stack else ""


@contextlib.contextmanager
def _stack_traces(record: bool) -> Iterator[None]:
    """Record (or not) each node's Python stack trace while exporting. Capture reads them only to say where
    a failing op was written, and recording them is ~10 % of an HF model's export time, so export runs
    without them and runs again with them only on that error path (torch versions without the switch
    always record them)."""
    config = torch.fx.config
    if not hasattr(config, "do_not_emit_stack_traces"):
        yield
        return
    old = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = not record
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = old


def _export(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], stack_traces: bool) -> Any:
    try:
        with _quiet(), _stack_traces(stack_traces):
            return torch.export.export(model, tuple(args), dict(kwargs), strict=False)
    except Exception as e:
        raise PathFailure("export", where(e) or "torch.export.export", first_line(e)) from e


def _source_line(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], node_name: str) -> str:
    """Export again recording stack traces and return the model-code line that created node `node_name`."""
    try:
        return source_line(_export(model, args, kwargs, stack_traces=True).graph_module.graph, node_name)
    except PathFailure:
        return ""


def capture_export(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> tuple[OpBuilder, fx.GraphModule, Any]:
    """Export `model` and build its ops; returns (ops, the exported graph module, the ExportedProgram).
    Raises PathFailure when export fails."""
    ep = _export(model, args, kwargs, stack_traces=False)
    gm = ep.graph_module
    sig = ep.graph_signature
    params = sig.inputs_to_parameters
    fuse_rms_norm(gm, lambda n: tuple(n.meta["val"].shape) if n.op == "placeholder" and n.name in params
                  and isinstance(n.meta.get("val"), torch.Tensor) else None, aten=True)
    names = canonical_names(model)
    by_name = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))

    def canonical(name: str) -> str:
        t = by_name.get(name)
        return names.get(id(t), name) if t is not None else name

    b = OpBuilder()
    for node in gm.graph.nodes:
        try:
            _add(b, node, sig, canonical)
        except SymbolicShapeError as e:
            src = where_in_stack(node.meta.get("stack_trace")) or _source_line(model, args, kwargs, node.name)
            raise PathFailure("export", describe_node(node) + (f", {src}" if src else ""), str(e)) from e
    return b, gm, ep


def _add(b: OpBuilder, node: fx.Node, sig: Any, canonical: Callable[[str], str]) -> None:
    """Record one node of the exported graph."""
    value = node.meta.get("val")
    if node.op == "placeholder":
        target = node.name
        if target in sig.inputs_to_parameters:
            b.add_param(node, canonical(sig.inputs_to_parameters[target]), value)
        elif target in sig.inputs_to_buffers:
            buf = canonical(sig.inputs_to_buffers[target])
            b.add_leaf(node, "other", "buffer", value, buf.rsplit(".", 1)[0] if "." in buf else "",
                       {"buffer": buf})
        elif target in sig.inputs_to_lifted_tensor_constants:
            b.add_leaf(node, "other", "constant", value, "",
                       {"constant": sig.inputs_to_lifted_tensor_constants[target]})
        elif isinstance(value, torch.Tensor):
            b.add_leaf(node, "input", target, value)
        else:
            b.add_value(node, value)
    elif node.op == "call_function":
        if isinstance(node.target, torch._ops.OpOverload):
            op, text = aten_op_name(node.target)
        elif node.target is operator.getitem:
            op, text = "getitem", "operator.getitem"
        else:
            op = text = getattr(node.target, "__name__", str(node.target))
        b.add_call(node, op, "aten", text, value, _module_path(node))
    elif node.op == "output":
        b.add_output(node)
    else:  # get_attr of submodules for higher-order ops: no tensor of its own
        b.add_value(node, value)
