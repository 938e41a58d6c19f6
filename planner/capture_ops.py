"""What one traced call is, for the cost model: its op kind and kind-specific attrs.

Both capture paths (torch.fx at the torch level, torch.export at the ATen level) normalise a call into a
`Call` and ask `classify` for `(kind, attrs)`. A call is named by its canonical op name, the same for
`torch.softmax`, `F.softmax`, `Tensor.softmax` and `aten.softmax` ("softmax"); a handler per op family,
registered with `@handles`, reads the arguments. In `Call.args` an activation input appears as `Act(i)`
(the i-th entry of the op's inputs), a parameter as `Param`, everything else as its concrete value
(shapes from `x.size()` are already folded in).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cost_models.ops import OpNode, TensorMeta

__all__ = ["Act", "Param", "Call", "classify", "handles", "plain", "ELEMENTWISE_SAVES"]


@dataclass(frozen=True)
class Act:
    """An activation argument: entry `index` of the op's inputs."""

    index: int


@dataclass(frozen=True)
class Param:
    """A parameter argument: its state_dict name, stored shape and dtype; `transposed` when the call gets
    a transposed view of it (`W.t()`, `aten.t(W)`)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    transposed: bool = False


@dataclass
class Call:
    """One traced call, normalised (see the module docstring).

    op: canonical op name; level: "torch" or "aten" (a few ops take their arguments in another order or
    encode them differently at ATen level); in_meta: metadata of each activation input; producers: the
    OpNode producing each activation input; outputs: metadata of each output.
    """

    op: str
    level: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    in_meta: list[TensorMeta]
    producers: list[OpNode]
    outputs: list[TensorMeta]
    extra: dict[str, Any] = field(default_factory=dict)

    def arg(self, i: int, name: str, default: Any = None) -> Any:
        """Argument `name`, given positionally at `i` or by keyword."""
        if name in self.kwargs:
            return self.kwargs[name]
        return self.args[i] if i < len(self.args) else default

    def params(self) -> list[Param]:
        return [a for a in _flat(self.args) + _flat(list(self.kwargs.values())) if isinstance(a, Param)]

    def ndim(self, i: int = 0) -> int:
        return len(self.in_meta[i].shape) if i < len(self.in_meta) else len(self.outputs[0].shape)


Handler = Callable[[Call], tuple[str, dict[str, Any]]]
_HANDLERS: dict[str, Handler] = {}


def handles(*ops: str) -> Callable[[Handler], Handler]:
    """Register a handler for canonical op names."""
    def register(fn: Handler) -> Handler:
        for op in ops:
            _HANDLERS[op] = fn
        return fn
    return register


def classify(call: Call) -> tuple[str, dict[str, Any]]:
    """(kind, attrs) of a call; unknown ops are ("other", {})."""
    handler = _HANDLERS.get(call.op)
    if handler is None:
        return "other", {}
    kind, attrs = handler(call)
    return kind, {k: plain(v) for k, v in attrs.items()}


def plain(value: Any) -> Any:
    """Attrs values as hashable plain data: tuples for sequences, slices as {"slice": (start, stop, step)}."""
    if isinstance(value, slice):
        return {"slice": (plain(value.start), plain(value.stop), plain(value.step))}
    if value is Ellipsis:
        return "..."
    if isinstance(value, (list, tuple)):
        return tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Act):
        return {"input": value.index}
    if isinstance(value, Param):
        return {"param": value.name}
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if hasattr(value, "__index__"):
        return int(value)
    return str(value)  # dtypes, devices, memory formats


def _flat(values: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flat(v))
        else:
            out.append(v)
    return out


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _is_scalar(v: Any) -> bool:
    return isinstance(v, (bool, int, float, complex))


# --- heavy ops ---------------------------------------------------------------------------------------
def _linear_attrs(call: Call, weight_transposed: bool, has_bias: bool) -> dict[str, Any]:
    return {"in_features": call.in_meta[0].shape[-1], "out_features": call.outputs[0].shape[-1],
            "has_bias": has_bias, "weight_transposed": weight_transposed}


@handles("linear")
def _linear(call: Call) -> tuple[str, dict[str, Any]]:
    x, w, b = call.arg(0, "input"), call.arg(1, "weight"), call.arg(2, "bias")
    if not (isinstance(x, Act) and isinstance(w, Param)):
        return "other", {}
    # F.linear(x, W) computes x @ W^T with W stored [out, in]; given W.t() the stored weight is [in, out].
    return "linear", _linear_attrs(call, weight_transposed=w.transposed, has_bias=b is not None)


@handles("addmm")
def _addmm(call: Call) -> tuple[str, dict[str, Any]]:
    bias, x, w = call.arg(0, "input"), call.arg(1, "mat1"), call.arg(2, "mat2")
    if isinstance(x, Act) and isinstance(w, Param):
        # x @ W: a weight stored [in, out] (HF Conv1D) is used as is, nn.Linear's [out, in] via W.t().
        return "linear", _linear_attrs(call, weight_transposed=not w.transposed, has_bias=isinstance(bias, Param))
    return "other", {}


@handles("matmul", "mm", "bmm")
def _matmul(call: Call) -> tuple[str, dict[str, Any]]:
    a, b = call.arg(0, "input"), call.arg(1, "other")
    if isinstance(a, Act) and isinstance(b, Param) and len(b.shape) == 2:
        return "linear", _linear_attrs(call, weight_transposed=not b.transposed, has_bias=False)
    if isinstance(a, Act) and isinstance(b, Act):
        prod = call.producers[b.index]
        nd = len(call.in_meta[b.index].shape)
        swapped = tuple(range(nd - 2)) + (nd - 1, nd - 2)
        transpose_b = prod.kind == "permute" and nd >= 2 and tuple(prod.attrs.get("dims", ())) == swapped
        return "matmul", {"transpose_b": transpose_b}
    return "other", {}


@handles("embedding")
def _embedding(call: Call) -> tuple[str, dict[str, Any]]:
    params = call.params()
    if len(params) != 1 or not call.in_meta:
        return "other", {}
    w = params[0]
    padding = call.arg(2, "padding_idx")
    if call.level == "aten" and padding == -1:  # aten.embedding's "no padding index"
        padding = None
    return "embedding", {"num_embeddings": w.shape[0], "embedding_dim": w.shape[1], "padding_idx": padding}


@handles("conv1d", "conv2d", "conv3d")
def _conv(call: Call) -> tuple[str, dict[str, Any]]:
    """F.conv2d(x, W, b, stride, padding, dilation, groups) / aten.conv2d: the facts a rule run whole reads
    (`planner.capture_opaque`): independent over the batch dim 0; saves its input (the weight is state)."""
    x, w = call.arg(0, "input"), call.arg(1, "weight")
    if not (isinstance(x, Act) and isinstance(w, Param)) or len(call.outputs) != 1:
        return "other", {}
    batched = len(call.in_meta[x.index].shape) == len(w.shape)
    batch = tuple(0 if i == x.index and batched else None for i in range(len(call.in_meta)))
    return "conv", {"groups": int(call.arg(6, "groups", 1)), "module": call.op, "batch_dims": batch if batched else None,
                    "out_batch_dims": (0,) if batched else None, "batch_note": "" if batched else "unbatched input",
                    "buffer_bytes": 0, "saved_inputs": (x.index,), "saved_bytes": 0, "saved_source": "rule"}


@handles("layer_norm", "native_layer_norm")
def _layer_norm(call: Call) -> tuple[str, dict[str, Any]]:
    shape, weight, eps = call.arg(1, "normalized_shape"), call.arg(2, "weight"), call.arg(4, "eps", 1e-5)
    return "layer_norm", {"normalized_shape": tuple(shape), "eps": float(eps), "elementwise_affine": weight is not None}


@handles("softmax", "log_softmax", "_softmax", "_log_softmax")
def _softmax(call: Call) -> tuple[str, dict[str, Any]]:
    nd = call.ndim()
    dim = call.arg(1, "dim")
    if dim is None:  # legacy implicit dim of F.softmax
        dim = 0 if nd in (0, 1, 3) else 1
    return "softmax", {"dim": _dim(int(dim), nd), "log": "log" in call.op}


@handles("dropout", "native_dropout")
def _dropout(call: Call) -> tuple[str, dict[str, Any]]:
    p, training = call.arg(1, "p", 0.5), call.arg(2, "training", call.arg(2, "train", True))
    return "dropout", {"p": float(p), "training": bool(training)}


_ACTIVATIONS = ("gelu", "relu", "silu", "tanh", "sigmoid", "mish", "elu", "leaky_relu", "hardswish", "softplus")


@handles(*_ACTIVATIONS)
def _activation(call: Call) -> tuple[str, dict[str, Any]]:
    approximate = call.kwargs.get("approximate", call.args[1] if call.op == "gelu" and len(call.args) > 1 else "none")
    return "activation", {"fn": call.op, "approximate": str(approximate)}


# cross_entropy_loss / nll_loss at ATen level encode the reduction as an int.
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


@handles("cross_entropy", "cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss2d")
def _cross_entropy(call: Call) -> tuple[str, dict[str, Any]]:
    if call.level == "aten" or call.op in ("cross_entropy_loss", "nll_loss_nd", "nll_loss2d"):
        # aten.cross_entropy_loss / nll_loss(self, target, weight, reduction, ignore_index)
        reduction = call.arg(3, "reduction", 1)
        ignore_index = call.arg(4, "ignore_index", -100)
    else:  # F.cross_entropy / F.nll_loss(input, target, weight, size_average, ignore_index, reduce, reduction)
        reduction = call.arg(6, "reduction", "mean")
        ignore_index = call.arg(4, "ignore_index", -100)
    reduction = _REDUCTIONS.get(reduction, reduction) if isinstance(reduction, int) else reduction
    fn = "nll_loss" if call.op.startswith("nll") else "cross_entropy"
    return "cross_entropy", {"fn": fn, "ignore_index": int(ignore_index), "reduction": str(reduction)}


# --- element-wise ops --------------------------------------------------------------------------------
# What autograd saves for backward, by op: "tensors" = every tensor input when there are two tensor
# operands (a tensor times a Python scalar saves nothing), "none", ("input", i) = the
# tensor at positional argument i (masked_fill's mask, where's condition), "output" = the result. Ops without a gradient (comparisons, logical ops) save nothing.
ELEMENTWISE_SAVES: dict[str, Any] = {
    "add": "none", "sub": "none", "rsub": "none", "neg": "none", "mul": "tensors", "div": "tensors",
    "masked_fill": ("input", 1), "where": ("input", 0), "pow": ("input", 0), "exp": "output", "log": ("input", 0),
    "sqrt": "output", "rsqrt": "output", "reciprocal": "output", "abs": ("input", 0), "square": ("input", 0),
    "sin": ("input", 0), "cos": ("input", 0), "clamp": ("input", 0), "maximum": "tensors", "minimum": "tensors",
    "floor_divide": "none", "remainder": "none", "eq": "none", "ne": "none", "lt": "none", "le": "none",
    "gt": "none", "ge": "none", "and": "none", "or": "none", "xor": "none", "not": "none", "bitwise_and": "none",
    "bitwise_or": "none", "bitwise_not": "none", "logical_and": "none", "logical_or": "none",
    "logical_not": "none",
}


@handles(*ELEMENTWISE_SAVES)
def _elementwise(call: Call) -> tuple[str, dict[str, Any]]:
    rule = ELEMENTWISE_SAVES[call.op]
    positional = list(call.args) + list(call.kwargs.values())
    operands = [a for a in positional if isinstance(a, (Act, Param))]
    saves: list[int] = []
    if rule == "tensors" and len(operands) >= 2:
        # x * y keeps each factor for the other's gradient; x * 0.5 keeps nothing.
        saves = [a.index for a in operands if isinstance(a, Act)]
    elif isinstance(rule, tuple):
        picked = call.arg(rule[1], {"masked_fill": "mask", "where": "condition"}.get(call.op, "input"))
        saves = [picked.index] if isinstance(picked, Act) else []
    scalars = tuple(v for v in positional if _is_scalar(v))
    return "elementwise", {"fn": call.op, "saves": tuple(saves), "saves_output": rule == "output",
                           "scalar": scalars}


# --- shape ops ---------------------------------------------------------------------------------------
@handles("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as", "reshape_as")
def _reshape(call: Call) -> tuple[str, dict[str, Any]]:
    return "reshape", {"shape": call.outputs[0].shape}


@handles("permute", "transpose", "t", "swapaxes", "swapdims", "T", "mT")
def _permute(call: Call) -> tuple[str, dict[str, Any]]:
    nd = call.ndim()
    dims = list(range(nd))
    if call.op == "permute":  # x.permute(0, 2, 1, 3), torch.permute(x, dims), aten.permute(x, dims)
        rest = call.args[1:] if len(call.args) > 1 else (call.kwargs.get("dims"),)
        dims = [_dim(int(d), nd) for d in _flat(list(rest))]
    elif call.op == "T":
        dims.reverse()
    elif nd >= 2:
        if call.op == "t":
            d0, d1 = 0, 1
        elif call.op == "mT":
            d0, d1 = nd - 2, nd - 1
        else:
            d0, d1 = _dim(int(call.arg(1, "dim0")), nd), _dim(int(call.arg(2, "dim1")), nd)
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return "permute", {"dims": tuple(dims)}


@handles("split", "split_with_sizes", "chunk", "tensor_split")
def _split(call: Call) -> tuple[str, dict[str, Any]]:
    dim = _dim(int(call.arg(2, "dim", 0)), call.ndim())
    return "split", {"dim": dim, "sizes": tuple(o.shape[dim] for o in call.outputs)}


@handles("getitem")
def _getitem(call: Call) -> tuple[str, dict[str, Any]]:
    return "getitem", {"index": call.args[1]}


@handles("slice")
def _slice(call: Call) -> tuple[str, dict[str, Any]]:
    # aten.slice(x, dim, start, end, step) == x[(:,) * dim + (start:end:step,)]
    dim = _dim(int(call.arg(1, "dim", 0)), call.ndim())
    index = (slice(None),) * dim + (slice(call.arg(2, "start"), call.arg(3, "end"), call.arg(4, "step", 1)),)
    return "getitem", {"index": index}


@handles("select")
def _select(call: Call) -> tuple[str, dict[str, Any]]:
    dim = _dim(int(call.arg(1, "dim")), call.ndim())
    return "getitem", {"index": (slice(None),) * dim + (int(call.arg(2, "index")),)}


@handles("contiguous", "clone", "to", "_to_copy", "type", "type_as", "float", "half", "bfloat16", "double",
         "alias", "detach", "lift_fresh_copy")
def _contiguous(call: Call) -> tuple[str, dict[str, Any]]:
    return "contiguous", {}


# --- reductions --------------------------------------------------------------------------------------
@handles("sum", "mean", "amax", "amin", "prod", "logsumexp")
def _reduction(call: Call) -> tuple[str, dict[str, Any]]:
    nd = call.ndim()
    dims = call.arg(1, "dim")
    if not isinstance(dims, (int, list, tuple)) or (isinstance(dims, (list, tuple)) and not dims):
        dims = None  # sum(x), sum(x, dtype=...), amax(x, dim=[]): over all dims
    if dims is None:
        dims = tuple(range(nd))
    elif isinstance(dims, int):
        dims = (dims,)
    keepdim = call.arg(2, "keepdim", False)
    return "reduction", {"fn": call.op, "dims": tuple(sorted(_dim(int(d), nd) for d in dims)),
                         "keepdim": bool(keepdim)}
