"""Embedding (y = W[ids], W: [V, H]): replicate, fsdp, vocabulary-parallel, hidden-split.

* `replicate` (dp = every axis): ids and y split over tokens; dW all-reduced over dp. Also fully
  replicated (dp = ()): every rank looks up every token, no collective (for small tables such as
  position embeddings whose output broadcasts against a batch-split tensor).
* `fsdp`: W's dim 0 (else dim 1) split over every axis, all-gathered in forward; the backward needs only
  the ids, so dW (a dense [V, H] buffer) is reduce-scattered without gathering W again.
* `vocab` (T): V split over T, ids replicated over T; each rank looks up its own rows, leaving a partial
  sum over T that is all-reduced (tag output) or, with `sp`, reduce-scattered onto the sequence dim (the
  backward then all-gathers dY, tag grad_output).
* `1d_col` (T): H split over T; y leaves tokens/(dp), H/T like a column-parallel linear's output.

The backward saves the ids only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cost_models.calls import Call
from cost_models.family import op_family
from cost_models.layout import Axes, Layout, split_tokens
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, TensorMeta
from cost_models.redistribution import backward_steps, plan_redistribution
from cost_models.strategies.base import (
    Candidates,
    Offer,
    Usage,
    axis_subsets,
    local_bytes,
    make_options,
    param_key,
    rest_axes,
    tensor_key,
)
from cost_models.strategy import Strategy

__all__ = ["embedding_rule", "embedding_call"]


def _ids_layout(shape: tuple[int, ...], axes: Axes, mesh: Mesh, seq: Axes = ()) -> Layout | None:
    tok = split_tokens(shape, len(shape), axes, mesh)
    if tok is None:
        return None
    dims = list(tok)
    dims[-1] = dims[-1] + tuple(seq)
    lay = Layout(tuple(dims))
    return lay if lay.fits(shape, mesh) else None


def _usage(op: OpNode, mesh: Mesh, ids_l: Layout, w_store: Layout, w_eff: Layout, y_eff: Layout,
           y_out: Layout) -> Usage:
    ids, y = op.input_meta[0], op.out
    wp = op.params[0]
    wm = TensorMeta(wp.shape, wp.dtype)
    u = Usage(mesh, dtype=y.dtype)
    u.param_elems = 0 if "weight" in op.attrs.get("tied", ()) else w_store.local_numel(wm.shape, mesh)
    w_gather = plan_redistribution(wm.shape, wm.itemsize, w_store, w_eff, mesh)
    y_reduce = plan_redistribution(y.shape, y.itemsize, y_eff, y_out, mesh)
    u.steps(w_gather, "forward", "weight")
    u.steps(y_reduce, "forward", "output")
    u.steps(backward_steps(y_reduce, y.shape, y.itemsize, mesh), "backward", "grad_output")
    token_axes = ids_l.axes()
    extra = tuple(a for d in range(2) for a in w_store.dims[d] if a not in w_eff.dims[d])
    w_eff_bytes, w_store_bytes = local_bytes(wm, w_eff, mesh), local_bytes(wm, w_store, mesh)
    u.collective("reduce_scatter", extra, w_eff_bytes, "backward", "grad_weight")
    u.collective("all_reduce", tuple(a for a in token_axes if a not in extra), w_store_bytes, "backward",
                 "grad_weight")
    u.save(tensor_key(op.inputs[0], ids_l), local_bytes(ids, ids_l, mesh))
    y_eff_bytes, y_out_bytes = local_bytes(y, y_eff, mesh), local_bytes(y, y_out, mesh)
    unreduced = y_eff_bytes if y_eff_bytes > y_out_bytes else 0
    u.temp(max((w_eff_bytes if w_gather else 0) + unreduced, unreduced + (w_eff_bytes if extra else 0)))
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
    ids = op.input_meta[0]
    V, H = op.params[0].shape
    wkey = param_key(op, 0)
    every = mesh.axis_names

    def offer(scheme: str, opts: dict, ids_l: Layout, w_store: Layout, w_eff: Layout, y_eff: Layout,
              y_out: Layout) -> Offer:
        strategy = Strategy(scheme, (ids_l,), (y_out,), ((wkey, w_store),), make_options(**opts))
        return strategy, _usage(op, mesh, ids_l, w_store, w_eff, y_eff, y_out)

    full = Layout(((), ()))
    ids_all = _ids_layout(ids.shape, every, mesh)
    if ids_all is not None:
        y_all = Layout(ids_all.dims + ((),))
        yield offer("replicate", {"dp": every}, ids_all, full, full, y_all, y_all)
        for dim, size in enumerate((V, H)):
            if size % mesh.world_size == 0:
                yield offer("fsdp", {"dp": every, "shard_dim": dim}, ids_all, Layout.shard(2, dim, every), full,
                            y_all, y_all)
                break
        else:
            yield f"fsdp: embedding table {(V, H)} divisible by {mesh.world_size} on neither dim"
    else:
        yield f"replicate/fsdp: tokens {ids.shape} cannot be split over {''.join(every)}"
    rep_ids = Layout.replicated(len(ids.shape))
    yield offer("replicate", {"dp": ()}, rep_ids, full, full, Layout(rep_ids.dims + ((),)),
                Layout(rep_ids.dims + ((),)))

    for T in axis_subsets(mesh):
        dp = rest_axes(mesh, T)
        ids_dp = _ids_layout(ids.shape, dp, mesh)
        label = "".join(T)
        if ids_dp is None:
            yield f"vocab/1d_col[T={label}]: tokens {ids.shape} cannot be split over {''.join(dp)}"
            continue
        y_dp = Layout(ids_dp.dims + ((),))
        if V % mesh.size(T) == 0:
            w_v = Layout.shard(2, 0, T)
            y_partial = Layout(y_dp.dims, partial=T)
            yield offer("vocab", {"T": T, "dp": dp, "sp": False}, ids_dp, w_v, w_v, y_partial, y_dp)
            ids_sp = _ids_layout(ids.shape, dp, mesh, seq=T)
            if ids_sp is not None:
                yield offer("vocab", {"T": T, "dp": dp, "sp": True}, ids_dp, w_v, w_v, y_partial,
                            Layout(ids_sp.dims + ((),)))
            else:
                yield f"vocab[T={label},sp]: sequence {ids.shape} not divisible by {mesh.size(T)}"
        else:
            yield f"vocab[T={label}]: vocabulary {V} not divisible by {mesh.size(T)} (axis {label})"
        if H % mesh.size(T) == 0:
            w_h = Layout.shard(2, 1, T)
            y_h = Layout(ids_dp.dims + (T,))
            yield offer("1d_col", {"T": T, "dp": dp}, ids_dp, w_h, w_h, y_h, y_h)
        else:
            yield f"1d_col[T={label}]: hidden {H} not divisible by {mesh.size(T)} (axis {label})"
