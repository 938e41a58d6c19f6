"""`apply_plan`: turn a model and a plan into this rank's parallel model (run on every rank).

    parallel = apply_plan(model, plan)          # inside an initialised torch.distributed process group
    loss = parallel(ids, targets)               # same call and result as model(ids, targets)

Checks come first and nothing is built when one fails: the plan's schema version, the world size, and the
fingerprint of the model captured again (with the input shapes recorded in the plan) against the plan's.
Then the captured FX graph is rewritten for this rank (`planner.apply.graph`): heavy ops become `layers3d`
layers holding this rank's shards (sliced from the dense weights, or initialised shard by shard when the
model is on the meta device), layouts are converted on the edges where the plan says so, and the blocks
the plan checkpoints run under activation checkpointing (`planner.apply.blocks`).

By default (a plan made with `plan(..., inputs="full")`) every rank passes the same full inputs and gets the
full outputs (a drop-in replacement); with `inputs="sharded"` each rank passes its block of the batch (rank r: rows r*B/N to (r+1)*B/N of the
global batch, as a data-parallel loader hands them out) and gets its block of each batched output.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from cost_models.layout import Layout, caller_layout
from cost_models.ops import OpNode
from layers3d.mesh import DeviceMesh
from planner.apply.agree import AGREE_TIMEOUT_S, agree, inputs_digest, model_digest, plan_digest
from planner.apply.blocks import CheckpointedBlock, extract_blocks
from planner.apply.graph import rewrite_graph
from planner.apply.layers import LayerContext, ParamHome, build_layer
from planner.apply.values import ApplyError, node_values
from planner.plans.check import check_layouts
from planner.plans.format import INPUT_MODES, SCHEMA_VERSION, Plan
from planner.trace.common import TORCH_DTYPES, dtype_name
from planner.trace.graph import ModelGraph
from planner.trace.tracer import capture

__all__ = ["apply_plan", "check_inputs", "ParallelModule", "PlanMismatchError", "ApplyError", "INPUT_MODES"]


class PlanMismatchError(ApplyError):
    """The plan was made for another model, another world size or another plan format."""


class ParallelModule(nn.Module):
    """This rank's part of a model parallelised by a plan (built by `apply_plan`).

    Layers sit at the module paths of the dense model (so `state_dict()` keys mostly match the dense ones,
    with local shards); call it like the dense model. `gather_state_dict` gives the dense state dict back.
    """

    def __init__(self, plan: Plan, source: ModelGraph, mesh: DeviceMesh, graph: fx.Graph, signature: inspect.Signature,
                 inputs: list[str], out_spec: Any, homes: dict[str, ParamHome], dense_keys: dict[str, str],
                 buffers: dict[str, str], extra: dict[str, torch.Tensor], input_mode: str) -> None:
        super().__init__()
        self.plan, self.device_mesh, self.input_mode = plan, mesh, input_mode
        self.source_graph = source    # the dense model as captured (its fingerprint is the plan's)
        self._graph, self._signature, self._inputs, self._out_spec = graph, signature, inputs, out_spec
        self.homes = homes            # dense parameter name -> where its block lives
        self.dense_keys = dense_keys  # dense state_dict key -> the canonical parameter/buffer name
        self.buffer_attrs = buffers   # canonical buffer name -> attribute holding it here
        self.extra = extra            # dense tensors no planned op uses (kept as they were)
        self._gm: fx.GraphModule | None = None

    def bind(self) -> None:
        """(Re)build the executable graph module and the checkpointed blocks against this module."""
        for m in self.modules():
            if isinstance(m, CheckpointedBlock):
                m.bind(self)
        self.__dict__["_gm"] = fx.GraphModule(self, self._graph, "ParallelGraph")

    def _apply(self, fn: Any, recurse: bool = True) -> ParallelModule:  # .to(), .cuda(), .double() ...
        super()._apply(fn, recurse)
        self.bind()
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"the parallel model takes the dense model's arguments: {e}") from None
        feeds = []
        for name in self._inputs:
            if name not in bound.arguments or not isinstance(bound.arguments[name], torch.Tensor):
                raise ApplyError(f"input {name!r} is missing: the plan was made with it as a tensor input; pass it "
                                 "as when planning")
            feeds.append(bound.arguments[name])
        out = self._gm(*feeds)
        if self._out_spec is not None:
            out = pytree.tree_unflatten(list(out), self._out_spec)
        return out

    def extra_repr(self) -> str:
        return f"mesh={self.plan.mesh}, rank={self.device_mesh.rank}, inputs={self.input_mode}"


def _set_path(root: nn.Module, path: str, value: nn.Module | torch.Tensor, persistent: bool = True) -> None:
    parent = root
    parts = path.split(".")
    for p in parts[:-1]:
        if p not in parent._modules:
            parent.add_module(p, nn.Module())
        parent = parent._modules[p]
    if isinstance(value, nn.Module):
        parent.add_module(parts[-1], value)
    else:
        parent.register_buffer(parts[-1], value, persistent=persistent)


def check_plan(model: nn.Module, plan: Plan, example_inputs: Any = None) -> ModelGraph:
    """Refuse a plan made for another plan format, world size or model (PlanMismatchError), or whose layouts
    do not fit the model's shapes (PlanError); return the model captured again. Collective-free, so every
    rank fails the same way before building anything."""
    if plan.schema_version != SCHEMA_VERSION:
        raise PlanMismatchError(f"the plan has schema_version {plan.schema_version}, this planner applies version "
                                f"{SCHEMA_VERSION}; re-run `planner plan` with this version")
    if not (dist.is_available() and dist.is_initialized()):
        raise ApplyError("apply_plan runs on every rank inside an initialised torch.distributed process group: call "
                         "torch.distributed.init_process_group(...) first (torchrun sets up the environment)")
    world = dist.get_world_size()
    if world != plan.world_size:
        raise PlanMismatchError(f"the plan is for {plan.world_size} ranks (mesh {plan.mesh}) but the process group "
                                f"has {world}; re-plan with --world-size {world} or launch {plan.world_size} ranks")
    check_inputs(model, plan, example_inputs)
    if example_inputs is None:
        if not plan.model.inputs:
            raise PlanMismatchError("the plan does not record the model's input shapes; pass example_inputs= to "
                                    "apply_plan or re-run `planner plan`")
        example_inputs = {i.name: torch.empty(tuple(i.shape), dtype=TORCH_DTYPES[i.dtype], device="meta")
                          for i in plan.model.inputs}
    with _buffers_like_params(model):
        graph = capture(model, example_inputs, name=plan.model.name)
    if graph.fingerprint != plan.model.fingerprint:
        raise PlanMismatchError(
            f"the plan was made for another model: its fingerprint is {plan.model.fingerprint[:12]} "
            f"({plan.model.name}), this model's is {graph.fingerprint[:12]} ({graph.name}: {len(graph)} ops); the "
            "architecture, the input shapes or the train/eval mode differ. Re-run `planner plan` for this model")
    check_layouts(graph, plan)  # a plan file edited after planning: layouts that no longer fit the shapes
    return graph


def _describe_inputs(entries: list[tuple[str, tuple[int, ...], str]]) -> str:
    return ", ".join(f"{n} {list(shape)} {dtype}" for n, shape, dtype in entries) or "no tensor inputs"


def _names_match(recorded: str, param: str) -> bool:
    """A traced input name for a forward parameter: the same, or as torch.fx renames it (`input` ->
    `input_1`, `*args` -> `args_0`)."""
    return recorded == param or re.fullmatch(re.escape(param) + r"_\d+", recorded) is not None


def check_inputs(model: nn.Module, plan: Plan, example_inputs: Any = None) -> None:
    """Refuse (PlanMismatchError, naming both sides) a plan whose recorded inputs do not fit `model`: an
    input name its forward does not take, or, given `example_inputs`, tensor inputs of other shapes or
    dtypes. Checked before the model is captured, so a plan for another model gets this error rather than a
    capture failure. Collective-free."""
    recorded = [(i.name, tuple(i.shape), i.dtype) for i in plan.model.inputs]
    if not recorded:
        return
    theirs = f"the plan was made for model {plan.model.name!r} with inputs {_describe_inputs(recorded)}"
    params = inspect.signature(model.forward).parameters
    unknown = [n for n, _, _ in recorded if not any(_names_match(n, p) for p in params)]
    if unknown:
        raise PlanMismatchError(f"{theirs}, but this model ({type(model).__name__}) takes "
                                f"({', '.join(params) or 'nothing'}), not {', '.join(unknown)}; plan this model with "
                                "`planner plan`, or apply the plan to the model it was made for")
    if example_inputs is None:
        return
    if isinstance(example_inputs, Mapping):
        given = dict(example_inputs)
    else:
        args = example_inputs if isinstance(example_inputs, tuple | list) else (example_inputs,)
        try:
            given = dict(inspect.signature(model.forward).bind_partial(*args).arguments)
        except TypeError as e:
            raise PlanMismatchError(f"{theirs}, but the example inputs do not fit this model's forward: {e}") from None
    ours = []
    for name, value in given.items():
        values = [value] if isinstance(value, torch.Tensor) else list(value) if isinstance(value, tuple | list) else []
        ours += [(name if len(values) == 1 and v is value else f"{name}_{k}", tuple(v.shape), dtype_name(v.dtype))
                 for k, v in enumerate(values) if isinstance(v, torch.Tensor)]
    if Counter((shape, dtype) for _, shape, dtype in recorded) - Counter((shape, dtype) for _, shape, dtype in ours):
        raise PlanMismatchError(f"{theirs}; this model ({type(model).__name__}) is called with "
                                f"{_describe_inputs(ours)}; plan it with these inputs (`planner plan`), or apply the "
                                "plan to the model and inputs it was made for")


@contextlib.contextmanager
def _buffers_like_params(model: nn.Module) -> Iterator[None]:
    """A model on the meta device whose buffers are real (causal masks the runtime needs): capture it
    with meta stand-ins for the buffers, so that every tensor it traces is on one device."""
    on_meta = any(p.device.type == "meta" for p in model.parameters())
    swapped: list[tuple[nn.Module, str, torch.Tensor]] = []
    if on_meta:
        for module in model.modules():
            for name, buf in list(module._buffers.items()):
                if buf is not None and buf.device.type != "meta":
                    swapped.append((module, name, buf))
                    module._buffers[name] = torch.empty_like(buf, device="meta")
    try:
        yield
    finally:
        for module, name, buf in swapped:
            module._buffers[name] = buf


def _run_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def apply_plan(model: nn.Module, plan: Plan, *, mesh: DeviceMesh | None = None, inputs: str | None = None,
               example_inputs: Any = None, agree_timeout_s: float = AGREE_TIMEOUT_S) -> ParallelModule:
    """This rank's parallel version of `model` under `plan` (call it on every rank).

    mesh: a `layers3d.DeviceMesh` for plan.mesh (built from it when None: a collective).
    inputs: "full" (every rank passes the whole batch and gets whole outputs) or "sharded" (each rank
        passes and gets its block of the batch dim); default: the plan's `options.inputs`, the mode its
        memory was priced for. A "sharded" plan run with "full" is refused (whole outputs on every rank
        need memory the plan did not count); a "full" plan runs "sharded" with less.
    example_inputs: inputs to capture the model with; by default meta tensors of the shapes in the plan.
    agree_timeout_s: how long this rank waits for the others to arrive at the check below.
    Before anything else every rank checks, over the rendezvous store, that all ranks hold the same plan,
    model shapes, inputs and world size (`planner.apply.agree`): RankMismatchError names the ranks that differ.
    Raises PlanMismatchError for a plan made for another model, world size or plan format.
    """
    if inputs is None:
        inputs = plan.options.inputs
    if inputs not in INPUT_MODES:
        raise ApplyError(f"inputs={inputs!r}: use 'full' (whole batch on every rank) or 'sharded' (each rank its "
                         "block of the batch)")
    if inputs == "full" and plan.options.inputs == "sharded":
        raise ApplyError("inputs='full' on a plan priced for inputs='sharded': whole outputs on every rank need "
                         "memory the plan did not count; call with inputs='sharded' or re-plan with inputs='full'")
    if dist.is_available() and dist.is_initialized():  # before anything that differs between ranks can run
        agree({"plan": plan_digest(plan), "model": model_digest(model), "world size": str(dist.get_world_size()),
               "inputs": inputs_digest(example_inputs) if example_inputs is not None else "the plan's",
               "input mode": inputs}, "apply_plan", timeout_s=agree_timeout_s)
    graph = check_plan(model, plan, example_inputs)
    if mesh is None:
        mesh = DeviceMesh(plan.mesh)
    elif mesh.mesh != plan.mesh:
        raise PlanMismatchError(f"mesh {mesh.mesh} is not the plan's mesh {plan.mesh}")
    device = _run_device()
    assignments = {a.node: a for a in plan.assignments}
    nv = node_values(graph, model)
    params = dict(model.named_parameters())
    ctx = LayerContext(mesh, params, device)

    def arriving(op: OpNode) -> Layout:
        shape = op.out.shape
        if inputs == "sharded" and shape and shape[0] % plan.world_size:
            raise ApplyError(f"input {op.name!r} has batch size {shape[0]}, which {plan.world_size} ranks cannot "
                             "share equally; use inputs='full' or a batch size divisible by the world size")
        return caller_layout(shape, inputs, plan.mesh)

    def leaving(op: OpNode, k: int) -> Layout:
        return caller_layout(op.input_meta[k].shape, inputs, plan.mesh)  # as the memory model prices it

    def tensor_of(op: OpNode, node: fx.Node) -> torch.Tensor:
        name = op.attrs.get("buffer")
        t = dict(model.named_buffers()).get(name) if name else None
        if t is None:
            program = getattr(graph, "program", None)
            const = op.attrs.get("constant")
            if program is not None and const in getattr(program, "constants", {}):
                t = program.constants[const]
            else:
                t = graph.gm.get_buffer(str(node.target)) if node.op == "get_attr" else None
        if t is None:
            raise ApplyError(f"cannot find the value of buffer/constant {name or node.target!r} of op {op.name}")
        if t.device.type == "meta":
            raise ApplyError(f"buffer {name or node.target!r} is on the meta device; give the model real buffers "
                             "(e.g. build them outside `with torch.device('meta')`) before apply_plan")
        return t.detach()

    result = rewrite_graph(graph, nv, assignments, mesh, lambda op, a: build_layer(op, a, ctx), arriving=arriving,
                           leaving=leaving, checkpointed=set(plan.checkpoint), device=device, tensor_of=tensor_of)
    main, blocks = extract_blocks(result.graph, lambda b: f"checkpoint_{b.replace('.', '_')}")
    program = getattr(graph, "program", None)
    out_spec = program.call_spec.out_spec if program is not None else None
    dense_keys, extra = _dense_keys(model, ctx.homes, result.buffer_names)
    pm = ParallelModule(plan, graph, mesh, main, inspect.signature(model.forward), result.inputs, out_spec, ctx.homes,
                        dense_keys, {v: k for k, v in result.buffer_names.items() if v}, extra, inputs)
    for path, module in result.modules.items():
        _set_path(pm, path, module)
    for attr, t in result.tensors.items():
        _set_path(pm, attr, t, persistent=bool(result.buffer_names.get(attr)))
    for name, block in blocks.items():
        _set_path(pm, name, block)
    pm.bind()
    return pm


def _dense_keys(model: nn.Module, homes: Mapping[str, ParamHome], buffers: Mapping[str, str | None]
                ) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """Every key of model.state_dict() -> the canonical tensor name (tied keys share one); the tensors no
    planned op uses are kept aside, as they are."""
    canonical = {id(t): n for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    used = set(homes) | {b for b in buffers.values() if b}
    keys: dict[str, str] = {}
    extra: dict[str, torch.Tensor] = {}
    for key, t in model.state_dict(keep_vars=True).items():
        name = canonical.get(id(t), key)
        keys[key] = name
        if name not in used:
            extra[name] = t.detach()
    return keys, extra
