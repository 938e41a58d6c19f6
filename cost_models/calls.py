"""One traced call as plain data: what an op family's capture classifier reads.

Both capture paths (torch.fx at the torch level, torch.export at the ATen level) normalise a call into a
`Call` and ask the op families (`cost_models.family.classify_call`) for `(kind, attrs)`. A call is named by
its canonical op name, the same for `torch.softmax`, `F.softmax`, `Tensor.softmax` and `aten.softmax`
("softmax"). In `Call.args` an activation input appears as `Act(i)` (the i-th entry of the op's inputs), a
parameter as `Param`, everything else as its concrete value (shapes from `x.size()` are already folded in).

Plain data only (no torch objects), so the classifiers live beside the strategy rules in cost_models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cost_models.ops import OpNode, TensorMeta

__all__ = ["Act", "Param", "Call", "plain", "flat", "norm_dim", "is_scalar"]


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
        return [a for a in flat(self.args) + flat(list(self.kwargs.values())) if isinstance(a, Param)]

    def ndim(self, i: int = 0) -> int:
        return len(self.in_meta[i].shape) if i < len(self.in_meta) else len(self.outputs[0].shape)


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


def flat(values: Sequence[Any]) -> list[Any]:
    """Nested lists/tuples flattened, in order."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(flat(v))
        else:
            out.append(v)
    return out


def norm_dim(d: int, ndim: int) -> int:
    """A possibly negative dim as its index in a tensor of `ndim` dims."""
    return d + ndim if d < 0 else d


def is_scalar(v: Any) -> bool:
    return isinstance(v, (bool, int, float, complex))
