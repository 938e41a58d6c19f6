"""Which ops' outputs share their input's storage: views and identities, so a saved view counts its base.

Autograd keeps a saved tensor's whole storage alive: a linear that saves `x[:, 0]` keeps all of `x`, and
a linear that saves `relu(h).flatten(1)` keeps the storage relu saved already. The runtime's views are:

* identities: an identity dropout (p = 0 or not training), a cast to the dtype it already has, `contiguous`
  of a contiguous tensor, `alias`;
* permute / transpose (a non-contiguous view);
* indexing with slices and ints (select, slice; `x[:, 0]`), a non-contiguous view in general;
* reshape / view / flatten / unflatten / squeeze / unsqueeze of a contiguous tensor, and those that only
  split dims or add or drop size-1 dims of any tensor; a reshape merging dims of a non-contiguous tensor
  copies (an expand that broadcasts is non-contiguous: repeat_kv's reshape of it copies, and SDPA's rule
  prices those copies; measured on HF Qwen2 under 3d_allreduce).

Only when the view op reads its input in the layout its producer makes it (no conversion on the edge).
Measured: torch-cnn replicate, fc saving `flatten(relu_1)` kept no bytes beyond relu's saved output
(65,536 B predicted twice before); HF ViT's classifier saving `x[:, 0]` keeps the whole (8, 17, 64) output
of the last layer norm (34,816 B, not the 2,048 B of the view).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cost_models.strategies.shapes import _index_map
from cost_models.strategies.views import _groups
from planner.search.build import BuiltProblem, _out_layout
from planner.trace.graph import ModelGraph

__all__ = ["storage_bases"]

_CASTS = ("to", "type", "type_as", "float", "half", "bfloat16", "double")
_ALWAYS_VIEW = ("squeeze", "unsqueeze")


def _name(target: str) -> str:
    """The op's own name in a target string ("aten.to.dtype" -> "to", "Tensor.contiguous" -> "contiguous")."""
    parts = [p for p in target.split(".") if p and p not in ("aten", "torch", "Tensor", "F", "default")]
    return parts[0] if parts else target


def _merges(in_shape: Sequence[int], out_shape: Sequence[int]) -> bool:
    """Whether reshaping `in_shape` to `out_shape` merges two or more dims of size > 1 (needs contiguity)."""
    groups = _groups(list(in_shape), list(out_shape))
    return groups is None or any(sum(in_shape[d] > 1 for d in gi) > 1 for gi, _ in groups)


def storage_bases(graph: ModelGraph, built: BuiltProblem, pick: dict[str, int]) -> dict[str, str]:
    """Op name -> the op whose output storage its output views (see the module docstring), for the ops
    whose output is a view or an identity of another op's single output; other ops are absent."""
    base: dict[str, str] = {}
    contiguous: dict[str, bool] = {}
    nodes = {n.name: n for n in graph.nodes}
    for op in graph.nodes:
        # an expand that broadcasts has stride-0 dims: a reshape merging them copies (repeat_kv's k/v)
        contiguous[op.name] = not (op.kind == "expand" and op.input_meta and
                                   math.prod(op.input_meta[0].shape) != math.prod(op.out.shape))
        if not op.inputs or op.inputs[0] not in nodes or len(op.outputs) != 1:
            continue
        src = op.inputs[0]
        producer = nodes[src]
        strat = built.strategies[op.name][pick[op.name]]
        if len(producer.outputs) != 1 or not strat.inputs or strat.inputs[0] != _out_layout(
                built.strategies[src][pick[src]], producer, op):
            continue
        x, name = op.input_meta[0], _name(op.target)
        if op.kind == "dropout":
            view = float(op.attrs.get("p", 0.5)) == 0.0 or not op.attrs.get("training", True)
            still = contiguous[src]
        elif op.kind == "contiguous":
            view = (name in _CASTS and x.dtype == op.out.dtype) or name == "alias" \
                or (name == "contiguous" and contiguous[src])
            still = contiguous[src]
        elif op.kind == "permute":
            view, still = True, list(op.attrs.get("dims", ())) == sorted(op.attrs.get("dims", ()))
        elif op.kind == "getitem":
            # slices and ints index a view; tensor (advanced) indexing copies
            view, still = _index_map(op.attrs.get("index"), len(x.shape)) is not None, False
        elif op.kind == "reshape":
            view = name in _ALWAYS_VIEW or contiguous[src] or not _merges(x.shape, op.out.shape)
            still = contiguous[src]
        else:
            view = still = False
        if view:
            base[op.name] = base.get(src, src)
            contiguous[op.name] = still
    return base
