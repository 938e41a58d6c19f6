"""The parts of capture both paths share: turning FX nodes with known values into `OpNode`s, finding the
model's repeated blocks, and saying where a path failed.

`OpBuilder` walks an FX graph whose nodes already carry values (fake or meta tensors, or concrete Python
values for `x.size()` and the like). A node becomes an `OpNode` when its value holds tensors; parameter
nodes (and transposed/cast views of them) become `Param`s of the ops that read them; every other node's
value is folded into the arguments of its consumers.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from cost_models.calls import Act, Call, Param
from cost_models.errors import PlannerError
from cost_models.family import OPAQUE, classify_call, prices_params
from cost_models.ops import OpNode, ParamInfo, TensorMeta
from planner.dtypes import TORCH_DTYPES, dtype_name, torch_dtype  # noqa: F401  (re-exported)
from planner.trace.graph import BlockInfo
from planner.trace.opaque import call_opaque_attrs

__all__ = ["OpBuilder", "PathFailure", "tensor_meta", "dtype_name", "TORCH_DTYPES", "torch_dtype", "canonical_names", "find_blocks",
           "assign_blocks", "where", "where_in_stack", "source_line", "first_line", "describe_node", "SymbolicShapeError"]

# Ops that, applied to a parameter alone, give a view or cast of it rather than an activation.
_PARAM_VIEW_OPS = {"t", "transpose", "permute", "T", "mT", "to", "_to_copy", "contiguous", "float", "half",
                   "bfloat16", "detach", "alias", "type"}


class PathFailure(Exception):
    """One capture path could not handle the model: `where` (source line or op) and `reason`."""

    def __init__(self, path: str, where: str, reason: str) -> None:
        super().__init__(f"{path}: {where}: {reason}")
        self.path, self.where, self.reason = path, where, reason


class SymbolicShapeError(PlannerError, ValueError):
    """A traced tensor whose shape depends on tensor values (torch.nonzero, boolean masks...)."""


def tensor_meta(t: torch.Tensor) -> TensorMeta:
    if not all(isinstance(s, int) for s in t.shape):
        raise SymbolicShapeError(f"output shape {tuple(t.shape)} depends on tensor values; the planner needs "
                                 f"static shapes")
    return TensorMeta(tuple(t.shape), dtype_name(t.dtype))


def canonical_names(model: nn.Module) -> dict[int, str]:
    """id(tensor) -> the name model.named_parameters()/named_buffers() gives it (the first of tied names)."""
    names: dict[int, str] = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        names.setdefault(id(t), name)
    return names


def _role(name: str) -> str:
    return "bias" if name.rsplit(".", 1)[-1].endswith("bias") else "weight"


def _tensors(value: Any) -> list[torch.Tensor]:
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


class OpBuilder:
    """Collects the OpNodes of one graph in execution order (see the module docstring)."""

    def __init__(self) -> None:
        self.nodes: list[OpNode] = []
        self.ops: dict[str, OpNode] = {}
        self.params: dict[str, Param] = {}
        self.values: dict[str, Any] = {}
        self.structures: dict[str, Any] = {}  # multi-output node -> its value (the nesting of its outputs)
        self.aliases: dict[str, tuple[str, int]] = {}  # sub-tuple getitem node -> (producer, first flat output)
        self._alias_structure: dict[str, Any] = {}  # sub-tuple getitem node -> its nesting

    # --- leaves --------------------------------------------------------------------------------
    def add_param(self, node: fx.Node, name: str, t: torch.Tensor) -> None:
        self.params[node.name] = Param(name, tuple(int(s) for s in t.shape), dtype_name(t.dtype))

    def add_value(self, node: fx.Node, value: Any) -> None:
        self.values[node.name] = value

    def add_leaf(self, node: fx.Node, kind: str, target: str, value: torch.Tensor, module_path: str = "",
                 attrs: dict[str, Any] | None = None) -> None:
        """A graph input or a buffer/constant: an op without inputs."""
        self._append(OpNode(name=node.name, kind=kind, target=target, outputs=[tensor_meta(value)],
                            module_path=module_path, attrs=attrs or {}))

    # --- calls ---------------------------------------------------------------------------------
    def add_call(self, node: fx.Node, op: str, level: str, target: str, value: Any, module_path: str,
                 module_classify: Callable[[Call], tuple[str, dict[str, Any]]] | None = None,
                 module_params: list[Param] | None = None,
                 module_opaque: Callable[[Call], dict[str, Any]] | None = None) -> None:
        """Record call node `node` (canonical name `op`) whose result is `value`. An op that holds
        parameters (or a leaf module holding buffers) and whose family does not price them
        (`cost_models.family.prices_params`) becomes an "opaque" op, with the facts `module_opaque` (a
        leaf module holding parameters or buffers) or `call_opaque_attrs` give."""
        outs = _tensors(value)
        if not outs:
            self.add_value(node, value)
            return
        if self._param_view(node, op, value):
            return
        if op == "getitem" and len(outs) > 1 and self._alias(node):
            return
        call, inputs = self._resolve(node, op, level, value)
        kind, attrs = module_classify(call) if module_classify else classify_call(call)
        params = list(module_params or []) + call.params()
        infos = list({p.name: ParamInfo(p.name, p.shape, p.dtype, _role(p.name)) for p in params}.values())
        infos.sort(key=lambda p: p.role == "bias")  # weights first (addmm takes the bias first)
        if not prices_params(kind):
            if module_opaque is not None:
                facts = module_opaque(call)
                if infos or facts["buffer_bytes"]:
                    kind, attrs = OPAQUE, facts
            elif infos:
                kind, attrs = OPAQUE, call_opaque_attrs(op, kind, call.in_meta, call.outputs, [p.shape for p in infos],
                                                        attrs)
        if op == "getitem" and call.producers and call.producers[0].name in self.structures:
            attrs = self._flat_getitem(node, call, attrs)
        if len(outs) > 1:
            self.structures[node.name] = value
        self._append(OpNode(name=node.name, kind=kind, target=target, inputs=inputs, input_meta=call.in_meta,
                            outputs=call.outputs, params=infos, module_path=module_path, attrs=attrs))

    def add_output(self, node: fx.Node) -> None:
        inputs: list[str] = []
        metas: list[TensorMeta] = []
        for a in pytree.tree_leaves(node.args[0]):
            if isinstance(a, fx.Node) and a.name in self.ops:
                op = self.ops[a.name]
                inputs += [a.name] * len(op.outputs)
                metas += op.outputs
        self._append(OpNode(name=node.name, kind="output", target="output", inputs=inputs, input_meta=metas,
                            outputs=list(metas)))

    # --- helpers -------------------------------------------------------------------------------
    def _source(self, node: fx.Node) -> tuple[str, int, Any] | None:
        """(multi-output producer, flat index of the item's first output, the item's nesting) of a getitem
        of a multi-output op or of a sub-tuple alias; None otherwise."""
        src, index = node.args[0], node.args[1] if len(node.args) > 1 else None
        if not isinstance(src, fx.Node) or not isinstance(index, int):
            return None
        if src.name in self.aliases:
            producer, base = self.aliases[src.name]
            structure = self._alias_structure[src.name]
        elif src.name in self.structures:
            producer, base, structure = src.name, 0, self.structures[src.name]
        else:
            return None
        if not isinstance(structure, (tuple, list)) or not -len(structure) <= index < len(structure):
            return None
        index %= len(structure)
        start = base + sum(len(_tensors(item)) for item in structure[:index])
        return producer, start, structure[index]

    def _alias(self, node: fx.Node) -> bool:
        """`out, (h, c) = lstm(x)`: the getitem picking the sub-tuple (h, c) is no op of its own; the
        getitems of it read the LSTM's flat outputs directly (one layout per output)."""
        found = self._source(node)
        if found is None:
            return False
        producer, start, item = found
        self.aliases[node.name] = (producer, start)
        self._alias_structure[node.name] = item
        return True

    def _flat_getitem(self, node: fx.Node, call: Call, attrs: dict[str, Any]) -> dict[str, Any]:
        found = self._source(node)
        return attrs if found is None else {**attrs, "index": found[1]}

    def _append(self, op: OpNode) -> None:
        self.nodes.append(op)
        self.ops[op.name] = op

    def _param_view(self, node: fx.Node, op: str, value: Any) -> bool:
        """`W.t()`, `W.to(bf16)`...: remember as a view of parameter W instead of making an op."""
        srcs = [a for a in node.all_input_nodes if a.name not in self.values]
        if op not in _PARAM_VIEW_OPS or len(srcs) != 1 or srcs[0].name not in self.params:
            return False
        if not isinstance(value, torch.Tensor):
            return False
        base = self.params[srcs[0].name]
        flip = False
        if len(base.shape) == 2:  # does the view swap the two dims of a matrix?
            args = [self.values.get(a.name, a) if isinstance(a, fx.Node) else a for a in node.args[1:]]
            if op in ("t", "T", "mT"):
                flip = True
            elif op == "transpose" and len(args) == 2:
                flip = int(args[0]) % 2 != int(args[1]) % 2
            elif op == "permute":
                dims = [int(d) % 2 for d in pytree.tree_leaves(args or list(node.kwargs.values()))]
                flip = dims == [1, 0]
        # The parameter keeps its stored shape and dtype; casts (W.to(bf16)) only change what the op reads.
        self.params[node.name] = Param(base.name, base.shape, base.dtype, base.transposed ^ flip)
        return True

    def _resolve(self, node: fx.Node, op: str, level: str, value: Any) -> tuple[Call, list[str]]:
        inputs: list[str] = []
        in_meta: list[TensorMeta] = []
        producers: list[OpNode] = []
        outputs = [tensor_meta(t) for t in _tensors(value)]

        def act(name: str, meta: TensorMeta) -> Act:
            inputs.append(name)
            in_meta.append(meta)
            producers.append(self.ops[name])
            return Act(len(inputs) - 1)

        def conv(a: Any) -> Any:
            if isinstance(a, fx.Node):
                if a.name in self.params:
                    return self.params[a.name]
                if a.name in self.values:
                    return self.values[a.name]
                if a.name in self.aliases:
                    producer, start = self.aliases[a.name]
                    if op == "getitem":  # (h, c)[0]: reads the LSTM's output h
                        return act(producer, outputs[0])
                    k = len(_tensors(self._alias_structure[a.name]))
                    return tuple(act(producer, m) for m in self.ops[producer].outputs[start:start + k])
                src = self.ops[a.name]
                if len(src.outputs) == 1:
                    return act(a.name, src.outputs[0])
                if op == "getitem":  # picking one output: it reads that output only
                    return act(a.name, outputs[0])
                return tuple(act(a.name, m) for m in src.outputs)
            if isinstance(a, (list, tuple)):
                return type(a)(conv(x) for x in a) if not hasattr(a, "_fields") else tuple(conv(x) for x in a)
            if isinstance(a, dict):
                return {k: conv(v) for k, v in a.items()}
            if isinstance(a, slice):
                return slice(conv(a.start), conv(a.stop), conv(a.step))
            return a

        args = tuple(conv(a) for a in node.args)
        kwargs = {k: conv(v) for k, v in node.kwargs.items()}
        return Call(op, level, args, kwargs, in_meta, producers, outputs), inputs


# --- blocks ------------------------------------------------------------------------------------------
def find_blocks(model: nn.Module) -> dict[str, str]:
    """Repeated blocks: children with integer names of an nn.ModuleList / nn.Sequential that have
    submodules of their own, outermost only. Returns block name -> the block module's class name."""
    blocks: dict[str, str] = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
            continue
        if any(name == b or name.startswith(b + ".") for b in blocks):
            continue
        for child_name, child in mod.named_children():
            if child_name.isdigit() and next(child.children(), None) is not None:
                blocks[f"{name}.{child_name}" if name else child_name] = type(child).__name__
    return blocks


def assign_blocks(nodes: list[OpNode], blocks: dict[str, str]) -> list[BlockInfo]:
    """Set `block` on every op that runs inside a block; return the blocks that hold ops, with classes."""
    members: dict[str, list[OpNode]] = {b: [] for b in blocks}
    for n in nodes:
        parts = n.module_path.split(".") if n.module_path else []
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in blocks:
                n.block = prefix
                members[prefix].append(n)
                break
    infos = []
    for name, ops in members.items():
        if ops:
            digest = _block_digest(name, ops)
            infos.append(BlockInfo(name, [n.name for n in ops], f"{blocks[name]}#{digest[:10]}"))
    return infos


def _block_digest(block: str, ops: list[OpNode]) -> str:
    """A digest of a block's structure that leaves out its name (so identical layers match)."""
    index = {n.name: i for i, n in enumerate(ops)}
    cut = len(block) + 1
    rows = []
    for n in ops:
        attrs = {k: v for k, v in n.attrs.items() if k not in ("buffer", "constant")}
        rows.append([n.kind, n.target, [index.get(i, "ext") for i in n.inputs],
                     [[list(m.shape), m.dtype] for m in n.input_meta + n.outputs],
                     [[p.name[cut:], list(p.shape), p.dtype, p.role] for p in n.params],
                     n.module_path[cut:], attrs])
    text = json.dumps(rows, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


# --- error locations ---------------------------------------------------------------------------------
_TORCH_DIR = os.path.dirname(torch.__file__)
_STDLIB_DIR = os.path.dirname(os.__file__)
# Capture's own code: this stage's folder, and cost_models (the op families' classifiers run during capture).
_CAPTURE_DIRS = tuple(os.path.join(d, "") for d in (
    os.path.dirname(os.path.abspath(__file__)),
    os.path.dirname(os.path.abspath(importlib.import_module("cost_models").__file__ or ""))))


def _is_model_code(filename: str) -> bool:
    """Not torch, not the standard library, not capture's own files (planner/trace/, cost_models/)."""
    path = os.path.abspath(filename)
    return not (path.startswith((_TORCH_DIR, _STDLIB_DIR) + _CAPTURE_DIRS) or filename.startswith("<"))


def where(exc: BaseException) -> str:
    """The innermost source line of the failing call that is model code (not torch, the standard
    library or capture itself), as "file:line in function: code"; "" when there is none."""
    for f in reversed(traceback.extract_tb(exc.__traceback__)):
        if _is_model_code(f.filename):
            return f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}"
    return ""


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n\s*(?P<code>[^\n]*)')


def where_in_stack(stack_trace: str | None) -> str:
    """The innermost model-code line of a node's recorded stack trace (FX's `node.stack_trace`)."""
    frames = [m for m in _FRAME.finditer(stack_trace or "") if _is_model_code(m["file"])]
    if not frames:
        return ""
    m = frames[-1]
    return f"{m['file']}:{m['line']} in {m['func']}: {m['code'].strip()}"


def source_line(graph: fx.Graph, node_name: str) -> str:
    """The innermost model-code line of node `node_name`'s recorded stack trace in `graph` ("" if none):
    the capture paths trace again with stack traces to name where a failing op was written."""
    for n in graph.nodes:
        if n.name == node_name:
            return where_in_stack(n.stack_trace)
    return ""


def describe_node(node: fx.Node) -> str:
    """A short name for an FX node in messages: "op nonzero (torch.nonzero)"."""
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    module = getattr(node.target, "__module__", "") or ""
    prefix = "torch." if module.startswith("torch") and not isinstance(node.target, str) else ""
    if isinstance(node.target, torch._ops.OpOverload):
        prefix, target = "", str(node.target)
    return f"op {node.name} ({prefix}{target})"


def first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    line = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."
