"""`capture(model, example_inputs)`: the model as a `ModelGraph` of `OpNode`s with exact shapes.

The capture stage is the module `planner.trace.tracer` (not `planner.trace.tracer`), so that the submodule never shadows
the exported function: `planner.trace.tracer` and `from planner import capture` are always the function.

Two paths, tried in order (or chosen with `method=`):

1. torch.fx symbolic tracing (`planner.trace.fx`): torch-level ops, the model's own layers as leaves.
2. torch.export (`planner.trace.export`): ATen-level ops, for models FX cannot trace (HF transformers).

Neither path computes anything or allocates parameter-sized memory: shapes come from meta tensors when the
model is on the meta device and from fake tensors otherwise, so gpt3-175b is captured on a laptop. When
both fail, `CaptureError` says where each stopped and why.

Inputs are either `example_inputs` (a tensor, a tuple of positional arguments, or a dict of keyword
arguments; their values are never read) or `input_shapes`: one entry per positional input, each a shape or
a `(shape, dtype)` pair (a dict of them for keyword inputs), `dtype` filling in entries without one. The
default dtype is int64 when the model has an embedding (token ids), otherwise the model's parameter dtype.
HF-style models that take `use_cache` get `use_cache=False`.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from cost_models.errors import PlannerError
from planner.trace.common import TORCH_DTYPES, OpBuilder, PathFailure, assign_blocks, find_blocks, torch_dtype
from planner.trace.export import capture_export
from planner.trace.fx import capture_fx
from planner.trace.graph import ModelGraph

__all__ = ["capture", "CaptureError", "METHODS"]

METHODS = ("auto", "fx", "export")


class CaptureError(PlannerError, ValueError):
    """The model could not be captured; the message says what each path tried and how to fix it."""


def capture(model: nn.Module, example_inputs: Any = None, *, input_shapes: Any = None,
            dtype: torch.dtype | str | None = None, name: str | None = None, method: str = "auto") -> ModelGraph:
    """Capture `model` called on `example_inputs` (or on inputs of `input_shapes`) as a ModelGraph.

    method: "auto" (FX, then export if FX fails), "fx" or "export".
    name: the graph's name (default: the model's class name).
    """
    if not isinstance(model, nn.Module):
        raise CaptureError(f"capture needs an nn.Module, got {type(model).__name__}")
    if method not in METHODS:
        raise CaptureError(f"unknown capture method {method!r}; use one of {METHODS}")
    args, kwargs = _inputs(model, example_inputs, input_shapes, dtype)
    if "use_cache" in inspect.signature(model.forward).parameters and "use_cache" not in kwargs:
        kwargs["use_cache"] = False  # HF models: no KV cache in the traced graph
    on_meta, device = _placement(model)
    name = name or type(model).__name__
    with _gc_paused(), _buffers_kept(model):
        return _capture(model, args, kwargs, name, method, on_meta, device)


@contextlib.contextmanager
def _buffers_kept(model: nn.Module) -> Iterator[None]:
    """Capture runs forward once on fake tensors, but a scalar buffer updated in place (BatchNorm's
    `num_batches_tracked += 1`) is real even then: put every real buffer back as it was."""
    kept = [(b, b.detach().clone()) for b in model.buffers() if b.device.type != "meta"]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, old in kept:
                if not torch.equal(b, old):
                    b.copy_(old)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Tracing creates tens of thousands of long-lived small objects; the cyclic collector's passes over
    them cost about 10-20% of gpt3-175b's capture CPU time here, and capture makes little cyclic garbage."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _capture(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, method: str,
             on_meta: bool, device: torch.device) -> ModelGraph:
    failures: list[PathFailure] = []
    if method in ("auto", "fx"):
        try:
            ops, gm = capture_fx(model, args, kwargs, on_meta=on_meta, device=device)
            return _assemble(model, name, ops, "fx", gm, None)
        except PathFailure as e:
            failures.append(e)
    if method in ("auto", "export"):
        ex_args, ex_kwargs = _export_inputs(args, kwargs, on_meta, device)
        try:
            ops, gm, program = capture_export(model, ex_args, ex_kwargs)
            return _assemble(model, name, ops, "export", gm, program)
        except PathFailure as e:
            failures.append(e)
    lines = "\n".join(f"  {f.path}: {f.reason}\n      at {f.where}" for f in failures)
    raise CaptureError(
        f"could not capture {name} ({' and '.join(f.path for f in failures)} failed):\n{lines}\n"
        f"How to fix: forward must run with shapes known in advance: remove Python control flow on tensor "
        f"values and .item()/.tolist()/nonzero()/boolean-mask indexing (use torch.where, or compute the "
        f"branch outside the model); method='fx' or method='export' tries one path only.") from failures[-1]


def _assemble(model: nn.Module, name: str, ops: OpBuilder, method: str, gm: Any, program: Any) -> ModelGraph:
    blocks = assign_blocks(ops.nodes, find_blocks(model))
    graph = ModelGraph.build(name, ops.nodes, blocks, method, gm)
    graph.program = program
    return graph


def _placement(model: nn.Module) -> tuple[bool, torch.device]:
    """(all parameters and buffers on meta, the device of the first of them)."""
    tensors = list(model.parameters()) + list(model.buffers())
    if not tensors:
        return False, torch.device("cpu")
    on_meta = all(t.device.type == "meta" for t in tensors)
    return on_meta, tensors[0].device


# --- inputs ----------------------------------------------------------------------------------------
def _inputs(model: nn.Module, example_inputs: Any, input_shapes: Any, dtype: Any
            ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if example_inputs is not None and input_shapes is not None:
        raise CaptureError("pass example_inputs or input_shapes, not both")
    if example_inputs is None and input_shapes is None:
        raise CaptureError("capture needs example_inputs (a tensor, a tuple of them or a dict) or input_shapes "
                           "(e.g. input_shapes=[(8, 1024)] for token ids of batch 8, sequence 1024)")
    if input_shapes is not None:
        default = _dtype(dtype) if dtype is not None else _default_dtype(model)
        if isinstance(input_shapes, Mapping):
            return (), {k: _empty(v, default) for k, v in input_shapes.items()}
        if _is_shape(input_shapes):
            input_shapes = [input_shapes]
        if not isinstance(input_shapes, Sequence):
            raise CaptureError(f"input_shapes must be a list of shapes or (shape, dtype) pairs, got {input_shapes!r}")
        return tuple(_empty(s, default) for s in input_shapes), {}
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise CaptureError(f"example_inputs must be a tensor, a tuple/list of positional inputs or a dict of "
                       f"keyword inputs, got {type(example_inputs).__name__}")


def _is_shape(x: Any) -> bool:
    return isinstance(x, (tuple, list, torch.Size)) and all(isinstance(s, int) and not isinstance(s, bool)
                                                            for s in x)


def _dtype(d: Any) -> torch.dtype:
    found = torch_dtype(d)
    if found is not None:
        return found
    raise CaptureError(f"unknown dtype {d!r}; use a torch.dtype or one of {', '.join(TORCH_DTYPES)}")


def _default_dtype(model: nn.Module) -> torch.dtype:
    if any(isinstance(m, nn.Embedding) for m in model.modules()):
        return torch.int64
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _empty(entry: Any, default: torch.dtype) -> torch.Tensor:
    """A meta tensor for an input_shapes entry: a shape, or (shape, dtype)."""
    if _is_shape(entry):
        shape, dt = entry, default
    elif isinstance(entry, (tuple, list)) and len(entry) == 2 and _is_shape(entry[0]):
        shape, dt = entry[0], _dtype(entry[1])
    else:
        raise CaptureError(f"bad input_shapes entry {entry!r}: use a shape such as (8, 1024) or a pair "
                           f"((8, 1024), torch.int64)")
    if any(s < 0 for s in shape):
        raise CaptureError(f"input shape {tuple(shape)} has a negative size")
    return torch.empty(tuple(shape), dtype=dt, device="meta")


def _export_inputs(args: tuple[Any, ...], kwargs: dict[str, Any], on_meta: bool, device: torch.device
                   ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Data-free stand-ins for the tensor inputs: meta tensors for a meta model, fake tensors on the model's
    device otherwise. Export never reads input values, and fresh tensors keep one tensor passed twice
    from being traced as a single input."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def conv(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        if on_meta:
            return torch.empty(v.shape, dtype=v.dtype, device="meta")
        with mode:
            return torch.empty(v.shape, dtype=v.dtype, device=device)

    return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}
