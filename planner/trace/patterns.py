"""Graph patterns capture rewrites into one call before it builds ops: RMSNorm written out by hand.

HF's LlamaRMSNorm (and Mistral's, Qwen2's, Meta's reference Llama) computes

    h = x.to(float32)                                  # optional upcast
    h = h * rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * h.to(x.dtype)                         # optional downcast; weight * h or h * weight

At either capture level these are five to eight nodes, one of them reading a parameter, which the planner
can neither parallelise op by op (the mean reduces the feature dim) nor apply (a `mul` holding a weight is
no parallel layer). `fuse_rms_norm` replaces each match by one `rms_norm(x, [H], weight, eps)` call
(`aten.rms_norm` on exported graphs, `F.rms_norm` on traced ones), so the op is priced, planned and
rewritten as one norm with a weight (`cost_models.strategies.rms_norm`, `layers3d.rms_norm`) whose
output has the pattern's shape and dtype. A match needs every inner node to be used only inside the
pattern; where dtypes are known (exported graphs) the downcast must restore x's dtype, on traced graphs it
must be `type_as(x)`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

__all__ = ["fuse_rms_norm"]

_UPCASTS = {"to", "_to_copy", "float", "type"}
_DOWNCASTS = {"to", "_to_copy", "type_as", "type", "bfloat16", "half"}


def _name(n: Any) -> str:
    if not isinstance(n, fx.Node) or n.op not in ("call_function", "call_method"):
        return ""
    t = n.target
    if n.op == "call_method":
        return str(t)
    if isinstance(t, torch._ops.OpOverload):
        return t._schema.name.split("::")[-1]
    if t is operator.mul:
        return "mul"
    if t is operator.add:
        return "add"
    return getattr(t, "__name__", "")


def _val(n: Any) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _is_check(n: fx.Node) -> bool:
    """torch.export's dead metadata checks (aten._assert_tensor_metadata): not real users."""
    return _name(n).startswith("_assert")


def _users(n: fx.Node) -> list[fx.Node]:
    return [u for u in n.users if not _is_check(u)]


def _only_user(n: fx.Node | None) -> fx.Node | None:
    users = _users(n) if isinstance(n, fx.Node) else []
    return users[0] if len(users) == 1 else None


def _other(node: fx.Node, one: Any) -> Any:
    """The argument of binary `node` that is not `one` (None when `one` is not an argument)."""
    a, b = (list(node.args) + [None, None])[:2]
    return b if a is one else a if b is one else None


def _last_dim_mean(mean: fx.Node, x: fx.Node) -> bool:
    dim = mean.args[1] if len(mean.args) > 1 else mean.kwargs.get("dim")
    keep = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    if not keep or len(dims) != 1 or not isinstance(dims[0], int):
        return False
    v = _val(x)
    return dims[0] == -1 or (v is not None and dims[0] == v.dim() - 1)


def _match(rsqrt: fx.Node, param_shape: Callable[[fx.Node], tuple[int, ...] | None]) -> dict[str, Any] | None:
    add = rsqrt.args[0] if rsqrt.args else None
    if _name(add) != "add":
        return None
    mean = next((a for a in add.args if _name(a) == "mean"), None)
    eps = _other(add, mean) if mean is not None else None
    if mean is None or not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return None
    sq = mean.args[0]
    if _name(sq) == "pow" and len(sq.args) > 1 and sq.args[1] == 2:
        x = sq.args[0]
    elif _name(sq) == "mul" and len(sq.args) == 2 and sq.args[0] is sq.args[1]:
        x = sq.args[0]
    else:
        return None
    if not isinstance(x, fx.Node) or not _last_dim_mean(mean, x):
        return None
    norm = _only_user(rsqrt)
    if _name(norm) != "mul" or _other(norm, rsqrt) is not x:
        return None
    nxt = _only_user(norm)
    cast = nxt if _name(nxt) in _DOWNCASTS else None
    wmul = _only_user(cast) if cast is not None else nxt
    if _name(wmul) != "mul":
        return None
    w = _other(wmul, cast if cast is not None else norm)
    shape = param_shape(w) if isinstance(w, fx.Node) else None
    if shape is None or len(shape) != 1:
        return None
    inner = [sq, mean, add, rsqrt, norm] + ([cast] if cast is not None else [])
    if any(len(_users(n)) != 1 for n in (sq, mean, add)) or any(u.op == "output" for u in wmul.users):
        return None
    src = x
    if cast is not None and _name(x) in _UPCASTS:
        base = x.args[0] if x.args else None
        if not isinstance(base, fx.Node):
            return None
        vb, vw = _val(base), _val(wmul)
        if vb is not None and vw is not None:
            if vb.dtype != vw.dtype:
                return None
        elif not (_name(cast) == "type_as" and len(cast.args) > 1 and cast.args[1] is base):
            return None
        src = base
    elif cast is not None:
        vx, vw = _val(x), _val(wmul)
        if vx is None or vw is None or vx.dtype != vw.dtype:
            return None
    return {"x": src, "upcast": x if src is not x else None, "weight": w, "size": shape[0], "eps": float(eps),
            "inner": inner, "out": wmul}


def _erase(graph: fx.Graph, n: fx.Node) -> None:
    for check in [u for u in n.users if _is_check(u)]:
        graph.erase_node(check)
    graph.erase_node(n)


def fuse_rms_norm(gm: fx.GraphModule, param_shape: Callable[[fx.Node], tuple[int, ...] | None], *,
                  aten: bool) -> int:
    """Replace every hand-written RMSNorm of `gm` by one rms_norm call (see the module docstring);
    `param_shape(node)` is the shape of the parameter a node stands for, else None. Returns the count."""
    target = torch.ops.aten.rms_norm.default if aten else F.rms_norm
    found = [m for n in list(gm.graph.nodes) if _name(n) == "rsqrt" for m in [_match(n, param_shape)] if m]
    for m in found:
        out: fx.Node = m["out"]
        with gm.graph.inserting_before(out):
            fused = gm.graph.call_function(target, (m["x"], [m["size"]], m["weight"], m["eps"]))
        fused.meta = dict(out.meta)
        out.replace_all_uses_with(fused)
        for n in [out] + m["inner"][::-1]:
            _erase(gm.graph, n)
        if m["upcast"] is not None and not _users(m["upcast"]):
            _erase(gm.graph, m["upcast"])
    if found:
        gm.recompile()
    return len(found)
