"""Embedding (y = W[ids], W: [V, H]): replicate, fsdp, vocabulary-parallel, hidden-split.

The schemes, their layouts and their collectives are values defined in `cost_models.embedding_scheme` (the
runtime executes the same steps); this rule enumerates them, prices each and says why the others are not
offered. The backward saves the ids only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cost_models.calls import Call
from cost_models.embedding_scheme import (
    EmbeddingPlan,
    EmbeddingSchemeError,
    embedding_options,
    embedding_plan,
    embedding_steps,
)
from cost_models.family import op_family
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, TensorMeta
from cost_models.strategies.base import (
    Candidates,
    Offer,
    Usage,
    axis_subsets,
    local_bytes,
    make_options,
    param_key,
    tensor_key,
)
from cost_models.strategy import Strategy

__all__ = ["embedding_rule", "embedding_call"]


def _usage(op: OpNode, mesh: Mesh, plan: EmbeddingPlan) -> Usage:
    ids, y = op.input_meta[0], op.out
    wp = op.params[0]
    wm = TensorMeta(wp.shape, wp.dtype)
    st = embedding_steps(plan, ids.shape, wm.shape[0], wm.shape[1], wm.itemsize, y.itemsize, mesh)
    u = Usage(mesh, dtype=y.dtype)
    u.param(0 if "weight" in op.attrs.get("tied", ()) else plan.w_store.local_numel(wm.shape, mesh))
    u.steps(st.w_fwd, "forward", "weight")
    u.steps(st.y_fwd, "forward", "output")
    u.steps(st.dy, "backward", "grad_output")
    u.steps(st.dw_scatter, "backward", "grad_weight")
    u.steps(st.dw_reduce, "backward", "grad_weight")
    u.save(tensor_key(op.inputs[0], plan.ids), local_bytes(ids, plan.ids, mesh))
    w_eff_bytes = local_bytes(wm, plan.w_eff, mesh)
    y_eff_bytes, y_out_bytes = local_bytes(y, plan.y_eff, mesh), local_bytes(y, plan.y_out, mesh)
    unreduced = y_eff_bytes if y_eff_bytes > y_out_bytes else 0
    u.temp(max((w_eff_bytes if st.w_fwd else 0) + unreduced, unreduced + (w_eff_bytes if st.dw_scatter else 0)))
    u.fwd_bytes = 2 * y_eff_bytes
    u.bwd_bytes = 2 * y_eff_bytes + w_eff_bytes
    return u


def embedding_call(call: Call) -> dict[str, Any] | None:
    """F.embedding(ids, W, padding_idx) / aten.embedding(W, ids, padding_idx): one parameter, the table."""
    params = call.params()
    if len(params) != 1 or not call.in_meta:
        return None
    w = params[0]
    padding = call.arg(2, "padding_idx")
    if call.level == "aten" and padding == -1:  # aten.embedding's "no padding index"
        padding = None
    return {"num_embeddings": w.shape[0], "embedding_dim": w.shape[1], "padding_idx": padding}


def _embedding_module(m: Any) -> dict[str, Any]:
    return {"num_embeddings": m.num_embeddings, "embedding_dim": m.embedding_dim, "padding_idx": m.padding_idx}


@op_family("embedding", ops=("embedding",), classify=embedding_call,
           modules=("torch.nn.modules.sparse.Embedding",), module_attrs=_embedding_module, in_map=True,
           prices_params=True)
def embedding_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    V, H = op.params[0].shape
    wkey = param_key(op, 0)
    said: set[str] = set()
    for scheme, opts in embedding_options(mesh, V, H, axis_subsets(mesh)):
        try:
            plan = embedding_plan(scheme, opts, op.input_meta[0].shape, V, H, mesh)
        except EmbeddingSchemeError as e:
            if str(e) not in said:
                said.add(str(e))
                yield str(e)
            continue
        strategy = Strategy(scheme, (plan.ids,), (plan.y_out,), ((wkey, plan.w_store),), make_options(**opts))
        yield strategy, _usage(op, mesh, plan)
