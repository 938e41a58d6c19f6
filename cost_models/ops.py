"""What the cost model knows about one op of a captured model: plain data, no torch objects.

`planner.capture` produces `OpNode`s (one per traced op, in execution order); the cost model reads them.
Keeping this description here keeps the data flowing one way: capture -> cost -> solve -> plan -> apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OP_KINDS", "PARAM_KINDS", "WHOLE_KINDS", "DTYPE_BYTES", "TensorMeta", "ParamInfo", "OpNode"]

# The op kinds capture recognises. Heavy kinds have parallel schemes; the rest follow their input.
OP_KINDS = (
    "input",          # a graph input (placeholder)
    "output",         # the graph output
    "linear",         # y = x @ W^T + b (nn.Linear, F.linear, aten.linear/addmm, HF Conv1D: attrs["weight_transposed"])
    "embedding",      # y = W[ids]
    "layer_norm",     # nn.LayerNorm / F.layer_norm / aten.native_layer_norm
    "matmul",         # batched matmul of two activations (attention scores, attention @ values)
    "softmax",        # softmax / log_softmax over attrs["dim"]
    "dropout",        # attrs["p"]
    "activation",     # gelu, relu, silu, tanh... (saves its input)
    "elementwise",    # add, sub, mul, div, masked_fill, where, scalar ops (attrs["saves"]: indices of saved inputs)
    "reshape",        # view / reshape / flatten / unflatten (attrs["shape"]: output shape)
    "permute",        # transpose / permute (attrs["dims"]: the permutation)
    "split",          # split / chunk along attrs["dim"] with attrs["sizes"]; outputs are tuple items
    "getitem",        # picks output attrs["index"] of a multi-output op, or indexes a tensor (attrs["index"])
    "contiguous",     # .contiguous() / clone / type casts that keep the shape
    "cross_entropy",  # F.cross_entropy(logits, targets)
    "reduction",      # sum / mean over dims
    "conv",           # nn.Conv1d/2d/3d, F.conv*d, aten.conv*d: run whole, or output channels split (attrs["groups"])
    "opaque",         # an op holding parameters or buffers with no rule of its own: run whole (replicate / fsdp)
    "other",          # anything else: kept replicated, reported by explain
)

# Kinds whose rules price the parameters their ops hold. An op with parameters of any other kind is
# captured as "opaque" (cost_models/strategies/opaque.py), so no parameter falls out of the memory model.
# A new op family that prices its own parameters adds its kind here (one line).
PARAM_KINDS = (
    "linear",
    "embedding",
    "layer_norm",
    "conv",
)
# Kinds run by layers3d/whole.py (the module or call with its parameters gathered or used as stored);
# their rules read the facts planner/capture_opaque.py records (batch dims, buffers, saved bytes).
WHOLE_KINDS = ("opaque", "conv")

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "complex64": 8,
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
    kind: one of OP_KINDS.
    target: what was called, for people ("nn.Linear", "aten.mm", "torch.matmul", "view").
    inputs: names of the nodes whose tensors this op reads, in argument order.
    input_meta / outputs: tensor metadata of those inputs and of this op's outputs (one per output).
    params: parameters the op uses (weights are looked up by name in the state dict).
    module_path: qualified name of the module the op came from ("transformer.h.0.attn.c_attn").
    block: name of the repeated block it belongs to ("transformer.h.0"), or None.
    attrs: kind-specific facts (see OP_KINDS).
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
