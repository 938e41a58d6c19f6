"""The per-rank FX rewrite: a captured graph plus a plan's layouts become a graph over local shards.

Every activation of the rewritten graph is this rank's block of the global tensor under the layout the plan
gives it. Walking the captured graph in order:

* a planned heavy op (linear, embedding, layer norm, loss) becomes a call of the parallel layer that
  `make_layer` builds for it; it receives only its activation inputs;
* shape computations (`x.size(1)`, `C // n_head`) are folded to their *global* values, so factories such as
  `torch.arange(T)` build global tensors (layout replicated), while `view`/`reshape` and `split` get the
  local shapes of their planned output layouts;
* on every edge whose producer layout differs from the layout the consumer's strategy needs, a
  redistribution module (`layers3d.redistribute`, the steps the cost model priced) is inserted; one per
  consumer argument, as the plan counts them;
* graph inputs arrive replicated (`inputs="full"`) or as data-parallel batch shards, and outputs leave
  replicated or as batch shards, converted by the same redistributions.

Nodes of checkpointed blocks (and the redistributions into them) are tagged in `node.meta["block"]`; the
extraction into `torch.utils.checkpoint` regions is `planner.apply.blocks`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from cost_models.layout import Layout
from cost_models.ops import FLOAT_DTYPES, OpNode
from cost_models.strategies.attention import matmul_grad_axes
from cost_models.strategies.views import broadcast_axes
from layers3d.functional import GradReduce, OutputReduce
from layers3d.redistribute import redistribute
from layers3d.whole import GatheredParams, WholeModule
from planner.apply.values import ApplyError, NodeValues, ParamRef, activation_args, map_aggregate, op_name
from planner.plans.format import Assignment
from planner.trace.graph import ModelGraph

__all__ = ["ApplyError", "Redistribute", "RewriteResult", "rewrite_graph", "BLOCK_KEY"]

BLOCK_KEY = "block"
_RESHAPES = {"view", "reshape", "_unsafe_view", "unflatten", "flatten", "squeeze", "unsqueeze", "view_as",
             "reshape_as"}
_SPLITS = {"split", "split_with_sizes", "chunk", "tensor_split"}
_EXPANDS = {"expand", "expand_as", "broadcast_to"}


class Redistribute(nn.Module):
    """Converts this rank's block of a tensor of global `shape` from layout `src` to layout `dst`."""

    def __init__(self, src: Layout, dst: Layout, shape: tuple[int, ...], mesh: Any, tag: str = "edge") -> None:
        super().__init__()
        self.src, self.dst, self.shape, self.mesh, self.tag = src, dst, tuple(shape), mesh, tag

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return redistribute(x, self.src, self.dst, self.mesh, self.shape, tag=self.tag)

    def extra_repr(self) -> str:
        return f"{self.src} -> {self.dst}, shape={self.shape}"


@dataclass
class RewriteResult:
    """The rewritten graph and the modules and tensors its call_module / get_attr nodes name."""

    graph: fx.Graph
    modules: dict[str, nn.Module] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    buffer_names: dict[str, str | None] = field(default_factory=dict)  # tensor attribute -> model buffer name
    inputs: list[str] = field(default_factory=list)


# make_layer(op, assignment) -> (module path, module) for a heavy op, or None to run the op as traced.
LayerFactory = Callable[[OpNode, Assignment], "tuple[str, nn.Module] | None"]


class _Rewriter:
    def __init__(self, graph: ModelGraph, nv: NodeValues, assignments: dict[str, Assignment], mesh: Any,
                 make_layer: LayerFactory, arriving: Callable[[OpNode], Layout],
                 leaving: Callable[[OpNode, int], Layout], checkpointed: set[str], device: torch.device,
                 tensor_of: Callable[[OpNode, fx.Node], torch.Tensor]) -> None:
        self.g, self.nv, self.asg, self.mesh = graph, nv, assignments, mesh
        self.tensor_of = tensor_of
        self.make_layer, self.arriving, self.leaving = make_layer, arriving, leaving
        self.ckpt, self.device = checkpointed, device
        self.ops = {n.name: n for n in graph.nodes}
        self.multi = {n.name: len(n.outputs) for n in graph.nodes if len(n.outputs) > 1}
        self.out = RewriteResult(fx.Graph())
        self.env: dict[str, Any] = {}          # original node -> new node (or constant)
        self.layouts: dict[str, list[Layout]] = {}  # original node -> actual layout of each output
        self.block: str | None = None           # checkpointed block of the node being emitted
        self._names: set[str] = set()

    # --- helpers -------------------------------------------------------------------------------
    def _assignment(self, name: str) -> Assignment:
        try:
            return self.asg[name]
        except KeyError:
            raise ApplyError(f"the plan has no assignment for op {name!r}; it was made for another version of "
                             "this model: re-run `planner plan`") from None

    def _module_name(self, base: str) -> str:
        name, k = base, 1
        while name in self._names:
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        return name

    def _emit(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = self.out.graph.create_node(*args, **kwargs)
        if self.block is not None:
            node.meta[BLOCK_KEY] = self.block
        return node

    def _convert(self, x: fx.Node, src: Layout, dst: Layout, shape: tuple[int, ...], name: str,
                 tag: str = "edge") -> fx.Node:
        if src == dst:
            return x
        path = self._module_name(f"redistribute_{name}")
        self.out.modules[path] = Redistribute(src, dst, shape, self.mesh, tag)
        return self._emit("call_module", path, (x,), {}, name=path)

    def _device(self, v: Any) -> Any:
        """Devices baked into the trace (torch.export records the capture device) become the run device."""
        return self.device if isinstance(v, torch.device) else v

    # --- the walk ------------------------------------------------------------------------------
    def run(self) -> RewriteResult:
        for node in self.g.gm.graph.nodes:
            if node.op == "output":
                self._output(node)
                continue
            if node.name in self.nv.params:
                continue  # parameters live in the layers that use them
            if node.name in self.nv.folded:
                self.env[node.name] = self.nv.folded[node.name]
                continue
            op = self.ops.get(node.name)
            if op is None:
                self._runtime(node)
            elif op.kind == "input":
                self._input(node, op)
            elif node.op in ("placeholder", "get_attr"):
                self._leaf(node, op)
            else:
                self._op(node, op)
        return self.out

    def _runtime(self, node: fx.Node) -> None:
        """A non-tensor value computed at run time (x.device): copied, reading the local tensors."""
        if not node.users:
            return  # dead checks such as aten._assert_tensor_metadata

        def local(v: Any) -> Any:
            if isinstance(v, fx.Node):
                if v.name in self.nv.params:
                    raise ApplyError(f"{node.format_node()} reads a parameter outside a planned layer")
                return self.env[v.name]
            return self._device(v)
        self.env[node.name] = self._emit(node.op, node.target, map_aggregate(node.args, local),
                                         map_aggregate(node.kwargs, local), name=node.name)

    def _input(self, node: fx.Node, op: OpNode) -> None:
        self.out.inputs.append(node.name)
        x = self._emit("placeholder", node.target, (), {}, name=node.name)
        want = self._assignment(op.name).outputs[0]
        self.env[node.name] = self._convert(x, self.arriving(op), want, op.out.shape, node.name, tag="io")
        self.layouts[node.name] = [want]

    def _leaf(self, node: fx.Node, op: OpNode) -> None:
        """A buffer or constant: registered on the new module whole (global, layout replicated)."""
        a = self._assignment(op.name)
        self.block = op.block if op.block in self.ckpt else None
        name = self._module_name(str(op.attrs.get("buffer") or f"planner_constant_{node.name}").replace(".", "_"))
        self.out.tensors[name] = self.tensor_of(op, node).to(self.device)
        self.out.buffer_names[name] = op.attrs.get("buffer")
        new = self._emit("get_attr", name, (), {}, name=node.name)
        self._done(node, op, a, new, produced_global=True)

    def _flat(self, op: OpNode, i: int) -> int:
        """The flat output index a getitem op reads (capture records it: `out, (h, c) = lstm(x)`)."""
        index = op.attrs.get("index")
        return int(index) if op.kind == "getitem" and isinstance(index, int) else i

    def _op(self, node: fx.Node, op: OpNode) -> None:
        a = self._assignment(op.name)
        self.block = op.block if op.block in self.ckpt else None
        if op.kind == "getitem" and isinstance(node.args[0], fx.Node) and node.args[0].name not in self.ops \
                and op.inputs and op.inputs[0] in self.multi:
            self._nested_getitem(node, op, a)
            return
        k = 0
        acts: list[Any] = []

        def act(src: fx.Node, i: int | None) -> Any:
            nonlocal k
            have = self.layouts[src.name][self._flat(op, i or 0)] if i is not None else self.layouts[src.name][0]
            value = self.env[src.name]
            if i is not None and op_name(node) == "getitem":
                # A getitem reads one output of a multi-output op: pick first, then convert the pick.
                value = self._emit("call_function", node.target, (value, i), {}, name=self._module_name(
                    f"{node.name}_pick"))
            need = a.inputs[k] if k < len(a.inputs) else None
            if need is not None and need != have:
                value = self._convert(value, have, need, op.input_meta[k].shape, f"{node.name}_in{k}")
            k += 1
            acts.append(value)
            return value

        def other(src: fx.Node) -> Any:
            if src.name in self.nv.params:
                return self.nv.params[src.name]
            return self.env[src.name]

        args, kwargs = activation_args(node, set(self.ops), self.multi, act, other)
        made = self.make_layer(op, a)
        if made is not None and isinstance(getattr(made[1], "layer", made[1]), GatheredParams):
            self._whole(node, op, args, kwargs, acts, made)
            return
        if made is not None:
            path, module = made
            path = self._module_name(path)
            self.out.modules[path] = module
            new = self._emit("call_module", path, tuple(acts), {}, name=node.name)
            self._done(node, op, a, new)
            return
        params = [p for p in pytree.tree_leaves((args, kwargs)) if isinstance(p, ParamRef)]
        if params:
            raise ApplyError(f"op {op.name} ({op.target}) reads parameter {params[0].name} but is not a layer "
                             f"the planner can parallelise; keep parameters inside nn.Linear / nn.Embedding / "
                             f"nn.LayerNorm modules or F.linear / F.embedding / F.layer_norm calls")
        if op.kind == "getitem" and node.args and isinstance(node.args[0], fx.Node) and node.args[0].name in self.multi:
            self.env[node.name] = acts[0]
            self.layouts[node.name] = [a.inputs[0] if a.inputs and a.inputs[0] is not None
                                       else self.layouts[node.args[0].name][self._flat(op, int(node.args[1]))]]
            self._check_follow(op, a)
            self.block = None
            return
        if op.kind in ("elementwise", "matmul"):
            args, kwargs = self._partial_grads(op, a, args, kwargs, acts)
        name = op_name(node)
        if op.kind == "reshape" and name in _RESHAPES:
            local = a.outputs[0].local_shape(op.out.shape, self.mesh.mesh)
            new = self._emit("call_method", "reshape", (acts[0], tuple(local)), {}, name=node.name)
        elif name in _EXPANDS and op.kind != "other":  # (an unplanned expand runs replicated, on global sizes)
            local = a.outputs[0].local_shape(op.out.shape, self.mesh.mesh)
            new = self._emit("call_method", "expand", (acts[0], tuple(local)), {}, name=node.name)
        elif op.kind == "split" and name in _SPLITS:
            dim = int(op.attrs["dim"])
            sizes = [lay.local_shape(meta.shape, self.mesh.mesh)[dim] for lay, meta in zip(a.outputs, op.outputs)]
            new = self._emit("call_function", torch.split, (acts[0], sizes, dim), {}, name=node.name)
        else:
            if node.op == "call_module":
                self._keep_module(op, str(node.target))
            new = self._emit(node.op, node.target, map_aggregate(args, self._device),
                             map_aggregate(kwargs, self._device), name=node.name)
        if op.kind == "reduction":
            new = self._reduce_output(node, op, a, new)
        self._done(node, op, a, new, produced_global=not op.inputs)

    def _nested_getitem(self, node: fx.Node, op: OpNode, a: Assignment) -> None:
        """`h` of `out, (h, c) = lstm(x)`: picks from the sub-tuple (a run-time value) and converts the pick
        from the layout of the multi-output op's flat output it is."""
        src = op.inputs[0]
        value = self._emit("call_function", node.target, (self.env[node.args[0].name], node.args[1]), {},
                           name=self._module_name(f"{node.name}_pick"))
        have = self.layouts[src][self._flat(op, 0)]
        need = a.inputs[0] if a.inputs and a.inputs[0] is not None else have
        self.env[node.name] = self._convert(value, have, need, op.input_meta[0].shape, f"{node.name}_in0")
        self.layouts[node.name] = [need]
        self._check_follow(op, a)
        self.block = None

    def _whole(self, node: fx.Node, op: OpNode, args: Any, kwargs: Any, acts: list[Any],
               made: tuple[str, nn.Module]) -> None:
        """An op run whole (its builder gave a `layers3d.whole.GatheredParams`): a module is called with its
        whole parameters (`WholeModule`, its buffers kept in it); a function call reads them from the
        store. A store whose op computes on a block of its parameters (a conv's output channels split
        over T) names the axes its input's gradient is all-reduced over (`input_grad_axes`)."""
        path, params = made
        if not isinstance(params, GatheredParams):  # a TiedLayer around the store
            raise ApplyError(f"op {op.name} ({op.target}) runs whole and shares a parameter with an earlier op; an "
                             "op run whole cannot share parameters: untie them, or give the op a layer the planner "
                             "knows")
        a = self._assignment(op.name)
        path = self._module_name(path)
        t_axes = params.input_grad_axes
        if t_axes and acts and isinstance(acts[0], fx.Node) and op.input_meta[0].dtype in FLOAT_DTYPES:
            reduce_path = self._module_name(f"grad_reduce_{op.name}_in0")
            self.out.modules[reduce_path] = GradReduce(t_axes, self.mesh)
            reduced = self._emit("call_module", reduce_path, (acts[0],), {}, name=reduce_path)
            args = map_aggregate(args, lambda v: reduced if v is acts[0] else v)
            kwargs = map_aggregate(kwargs, lambda v: reduced if v is acts[0] else v)
        args, kwargs = map_aggregate(args, self._device), map_aggregate(kwargs, self._device)
        if node.op == "call_module":
            dense = self.g.gm.get_submodule(str(node.target))
            layer = WholeModule(dense, params, device=self.device, prefix=f"{op.module_path or node.target}.")
            self.out.modules[path] = layer
            for inner, _ in layer.module.named_buffers():
                self.out.buffer_names[f"{path}.module.{inner}"] = f"{op.module_path or node.target}.{inner}"
            new = self._emit("call_module", path, args, kwargs, name=node.name)
        else:  # under its own name: the path of the module the call sits in may hold other layers
            path = self._module_name(f"{op.module_path}.{node.name}_params" if op.module_path else f"{node.name}_params")
            self.out.modules[path] = params
            store = self._emit("call_module", path, (), {}, name=path.replace(".", "_"))
            index = {n: i for i, n in enumerate(params.names)}

            def whole(v: Any) -> Any:
                if not isinstance(v, ParamRef):
                    return v
                p = self._emit("call_function", _getitem, (store, index[v.name]), {})
                return self._emit("call_method", "t", (p,), {}) if v.transposed else p
            new = self._emit(node.op, node.target, map_aggregate(args, whole), map_aggregate(kwargs, whole),
                             name=node.name)
        self._done(node, op, a, new)

    def _keep_module(self, op: OpNode, target: str) -> None:
        """A traced leaf module that is not a planned layer (dropout, an activation) runs as is."""
        module = self.g.gm.get_submodule(target)
        if next(module.parameters(), None) is not None:
            raise ApplyError(f"op {op.name} ({op.target}) has parameters but no parallel layer; the planner can "
                             "parallelise nn.Linear, nn.Embedding and nn.LayerNorm (and HF Conv1D) only")
        self._names.add(target)
        self.out.modules[target] = module

    def _partial_grads(self, op: OpNode, a: Assignment, args: Any, kwargs: Any, acts: list[Any]) -> tuple[Any, Any]:
        """An input whose gradient is a partial sum gets it all-reduced (GradReduce), as the cost model
        prices it: an element-wise input broadcast over split output dims, a matmul operand lacking an
        axis that splits the output (`matmul_grad_axes`)."""
        swap: dict[fx.Node, fx.Node] = {}
        for k, (value, meta) in enumerate(zip(acts, op.input_meta)):
            if meta.dtype not in FLOAT_DTYPES or not isinstance(value, fx.Node) or value in swap:
                continue
            if op.kind == "matmul":
                lay = a.inputs[k] if k < len(a.inputs) else None
                axes = matmul_grad_axes(a.outputs[0], lay) if lay is not None else ()
            else:
                axes = broadcast_axes(a.outputs[0], meta.shape, op.out.shape)
            if axes:
                path = self._module_name(f"grad_reduce_{op.name}_in{k}")
                self.out.modules[path] = GradReduce(axes, self.mesh)
                swap[value] = self._emit("call_module", path, (value,), {}, name=path)
        if not swap:
            return args, kwargs
        def sub(v: Any) -> Any:
            return swap.get(v, v) if isinstance(v, fx.Node) else v
        return map_aggregate(args, sub), map_aggregate(kwargs, sub)

    def _reduce_output(self, node: fx.Node, op: OpNode, a: Assignment, new: fx.Node) -> fx.Node:
        """A sum/mean over split dims leaves a partial result: all-reduce it (tag output)."""
        lay = a.inputs[0]
        nd = len(op.input_meta[0].shape)
        dims = op.attrs.get("dims")
        reduced = set(range(nd)) if dims is None else {int(d) % nd for d in dims}
        axes = tuple(ax for d in sorted(reduced) for ax in lay.dims[d]) if lay is not None else ()
        if not axes:
            return new
        fn = op.attrs.get("fn")
        if fn not in ("sum", "mean"):
            raise ApplyError(f"{op.name}: {fn} over dims split over {''.join(axes)} is not supported; only sum and "
                             "mean reduce split dims")
        path = self._module_name(f"reduce_{op.name}")
        self.out.modules[path] = OutputReduce(axes, self.mesh, float(self.mesh.size(axes)) if fn == "mean" else 1.0)
        return self._emit("call_module", path, (new,), {}, name=path)

    def _check_follow(self, op: OpNode, a: Assignment) -> None:
        if a.outputs and self.layouts[op.name][0] != a.outputs[0]:
            raise ApplyError(f"op {op.name}: its input layout {self.layouts[op.name][0]} and its planned output "
                             f"layout {a.outputs[0]} differ; the plan is inconsistent: re-run `planner plan`")

    def _done(self, node: fx.Node, op: OpNode, a: Assignment, new: fx.Node, produced_global: bool = False) -> None:
        """Record `new` as `node`'s value; a tensor built without activation inputs (a factory, a buffer)
        is global, so it is sliced to its planned layout."""
        if produced_global:
            if len(op.outputs) != 1:
                raise ApplyError(f"op {op.name} builds {len(op.outputs)} tensors without inputs; not supported")
            rep = Layout.replicated(len(op.out.shape))
            new = self._convert(new, rep, a.outputs[0], op.out.shape, node.name)
        self.env[node.name] = new
        self.layouts[node.name] = list(a.outputs)
        self.block = None

    def _output(self, node: fx.Node) -> None:
        op = self.ops.get(node.name)
        a = self.asg.get(node.name)
        k = 0

        def act(src: fx.Node, i: int | None) -> Any:
            nonlocal k
            have = self.layouts[src.name][i or 0]
            value = self.env[src.name]
            if i is not None:
                value = self._emit("call_function", _getitem, (value, i), {})
            shape = op.input_meta[k].shape if op is not None else ()
            need = a.inputs[k] if a is not None and k < len(a.inputs) and a.inputs[k] is not None else have
            value = self._convert(value, have, need, shape, f"output{k}")
            want = self.leaving(op, k) if op is not None else need
            value = self._convert(value, need, want, shape, f"output{k}_io", tag="io")
            k += 1
            return value

        def other(src: fx.Node) -> Any:
            return self.env[src.name]

        args, _ = activation_args(node, set(self.ops), self.multi, act, other)
        self.block = None
        self._emit("output", "output", args, {})


def _getitem(x: Any, i: int) -> Any:
    return x[i]


def rewrite_graph(graph: ModelGraph, nv: NodeValues, assignments: dict[str, Assignment], mesh: Any,
                  make_layer: LayerFactory, *, arriving: Callable[[OpNode], Layout],
                  leaving: Callable[[OpNode, int], Layout], checkpointed: set[str],
                  device: torch.device, tensor_of: Callable[[OpNode, fx.Node], torch.Tensor]) -> RewriteResult:
    """Rewrite `graph.gm` for this rank (see the module docstring).

    assignments: the plan's assignment per op name; mesh: the `layers3d.DeviceMesh`;
    arriving(input op): the layout a graph input arrives in; leaving(output op, k): the layout output k
    must leave in; checkpointed: names of the blocks to tag for checkpointing; device: where factories
    traced with a device build their tensors; tensor_of(op, node): the value of a buffer or constant.
    """
    return _Rewriter(graph, nv, assignments, mesh, make_layer, arriving, leaving, checkpointed, device,
                     tensor_of).run()
