"""What the cost model knows about one op of a captured model: plain data, no torch objects.

`planner.trace.tracer.capture` produces `OpNode`s (one per traced op, in execution order); the cost model reads them.
Keeping this description here keeps the data flowing one way: capture -> cost -> solve -> plan -> apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DTYPE_BYTES", "FLOAT_DTYPES", "TensorMeta", "ParamInfo", "OpNode"]

# Real floating-point dtypes: the tensors that carry gradients (and whose gradients the memory model counts).
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
}


@dataclass(frozen=True)
class TensorMeta:
    """Global shape and dtype of one tensor (dtype as torch's short name, e.g. "float32")."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class ParamInfo:
    """A parameter an op uses: its qualified name in model.state_dict(), shape, dtype and role."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str  # "weight" or "bias"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class OpNode:
    """One op of the captured graph.

    name: unique node name (the FX node's name).
    kind: an op family's kind (`cost_models.family.op_kinds()`; "input", "output", "other" always exist).
    target: what was called, for people ("nn.Linear", "aten.mm", "torch.matmul", "view").
    inputs: names of the nodes whose tensors this op reads, in argument order.
    input_meta / outputs: tensor metadata of those inputs and of this op's outputs (one per output).
    params: parameters the op uses (weights are looked up by name in the state dict).
    module_path: qualified name of the module the op came from ("transformer.h.0.attn.c_attn").
    block: name of the repeated block it belongs to ("transformer.h.0"), or None.
    attrs: kind-specific facts (read by the family's capture classifier, see its strategy file).
    """

    name: str
    kind: str
    target: str
    inputs: list[str] = field(default_factory=list)
    input_meta: list[TensorMeta] = field(default_factory=list)
    outputs: list[TensorMeta] = field(default_factory=list)
    params: list[ParamInfo] = field(default_factory=list)
    module_path: str = ""
    block: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> TensorMeta:
        return self.outputs[0]

    @property
    def param_numel(self) -> int:
        return sum(p.numel for p in self.params)
