"""`F.scaled_dot_product_attention` as one op: heads split over the tensor-parallel axes, batch over the
others, no communication inside.

q [*batch, Hq, L, E], k [*batch, Hk, S, E], v [*batch, Hk, S, Ev], optional mask broadcastable to
[*batch, Hq, L, S]. A strategy splits the batch dims (heads included) of q and takes k and v split the same
way; with grouped-query attention (Hk < Hq, `enable_gqa`) the heads' axes must divide Hk as well, and the
contiguous blocks then match (query head h reads key head h // (Hq/Hk)). The query length L and the head
dims stay whole (a split L would move the causal diagonal); the mask takes the batch splits on the dims
where it is full size and is whole on the dims it broadcasts over. A q layout that cannot be used (its L or
E split) is offered with those dims unsplit, the edge paying the conversion; replicated is always offered.

Saved for backward, measured with saved_tensors_hooks (torch 2.13): the fused kernels (CUDA flash /
memory-efficient, and CPU's flash kernel when dropout is off) keep q, k, v as given, the output, one fp32
logsumexp per query row, and a mask converted to q's dtype; CUDA with dropout also keeps the RNG seed and
offset. The CPU kernels write the output in q's memory order (empty_like(q)), the CUDA ones in
[*batch, L, Hq, Ev] order; when the output's only reader is a permute and a reshape merging the heads back
that torch can view in that order (`cost_models.strides`), the output projection's saved input is the
attention output's storage, saved once (hint `out_view`, per device kind): HF's q stored heads-transposed
([*batch, L, Hq, E] viewed as [*batch, Hq, L, E]) read back through `transpose(1, 2).contiguous().view(...)`
on both; torch's MultiheadAttention (q stored [L, B, H, E], read back through `permute(2, 0, 1, 3)` and a
reshape to [L * B, H * E]) on CPU only (measured: TransformerEncoder's saved activations 0.91-0.94 of the
prediction before); a q, k or v that is a piece of a fused
projection's output (GPT-NeoX's chunk) keeps the whole output alive (hint `saved_views`); a k or v made by
repeat_kv (expand + reshape) from one local KV head is a view of that head (hint `repeated_kv`). On CPU with dropout the math fallback runs in fp32 and keeps three [*batch, Hq, L, S] fp32
tensors (scores, probabilities, dropped probabilities) and fp32 copies of q, k (at Hq heads) and v^T.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cost_models.calls import Act, Call
from cost_models.compute import matmul_flops
from cost_models.family import op_family
from cost_models.layout import Axes, Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, TensorMeta
from cost_models.strategies.base import Candidates, Offer, Usage, input_candidates_for, local_bytes, tensor_key
from cost_models.strategies.views import permute_layout, reshape_layout, restrict_layout
from cost_models.strategy import Strategy
from cost_models.strides import is_contiguous, runtime_strides, view_strides

__all__ = ["sdpa_rule", "sdpa_call", "sdpa_output_view", "SDPA_BWD_FLOPS_RATIO"]

SDPA_BWD_FLOPS_RATIO = 2.5  # flash backward: recompute scores, then dV, dP, dQ, dK: 5 matmuls against 2
_LSE_BYTES = 4
_RNG_BYTES = 16  # philox seed and offset, one int64 each


def _kv_layout(lq: Layout, q: TensorMeta, kv: TensorMeta, mesh: Mesh) -> Layout | str:
    """k or v's layout for a q in `lq`: same batch/head splits where the sizes allow, last two dims whole."""
    nq, nk = len(q.shape), len(kv.shape)
    dims: list[Axes] = [()] * nk
    for d in range(nk - 2):
        qd = d + nq - nk
        axes = lq.dims[qd] if qd >= 0 else ()
        if not axes:
            continue
        if kv.shape[d] == 1:
            return f"key/value dim {d} broadcasts but q splits it"
        if kv.shape[d] % mesh.size(axes):
            return f"key/value dim {d} ({kv.shape[d]}) not divisible by {mesh.size(axes)} (axes {''.join(axes)})"
        dims[d] = axes
    return Layout(tuple(dims))


def _usable(lq: Layout) -> Layout:
    return Layout(lq.dims[:-2] + ((), ()))


def sdpa_call(call: Call) -> dict[str, Any] | None:
    """F.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
    scale=None, enable_gqa=False), at torch and ATen level; q, k, v must be the op's first three activation
    inputs and the mask an activation (else the call is not this family and runs replicated)."""
    q, k, v = call.arg(0, "query"), call.arg(1, "key"), call.arg(2, "value")
    mask = call.arg(3, "attn_mask")
    if not all(isinstance(t, Act) for t in (q, k, v)) or (mask is not None and not isinstance(mask, Act)):
        return None
    if [a.index for a in (q, k, v)] != [0, 1, 2]:
        return None
    scale = call.arg(6, "scale")
    return {"is_causal": bool(call.arg(5, "is_causal", False)), "dropout_p": float(call.arg(4, "dropout_p", 0.0)),
            "scale": None if scale is None else float(scale), "enable_gqa": bool(call.arg(7, "enable_gqa", False)),
            "mask": None if mask is None else mask.index}


@op_family("attention", ops=("scaled_dot_product_attention",), classify=sdpa_call, in_map=True)
def sdpa_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    q, k, v = op.input_meta[:3]
    mask_i = op.attrs.get("mask")
    nq = len(q.shape)
    pool: list[Layout] = []
    for lq in input_candidates_for(op, 0, candidates, mesh) + [Layout.replicated(nq)]:
        for cand in (lq, _usable(lq)):
            if cand not in pool and not cand.dims[-1] and not cand.dims[-2]:
                pool.append(cand)
    scores = (*q.shape[:-1], k.shape[-2])  # [*batch, Hq, L, S]
    for lq in pool:
        if not lq.fits(q.shape, mesh):
            continue
        lk, lv = _kv_layout(lq, q, k, mesh), _kv_layout(lq, q, v, mesh)
        if isinstance(lk, str) or isinstance(lv, str):
            yield lk if isinstance(lk, str) else lv
            continue
        ins = [lq, lk, lv]
        if mask_i is not None:
            m = op.input_meta[mask_i]
            ins.append(restrict_layout(Layout(lq.dims[:-1] + ((),)), m.shape, scores))
        out = Layout(lq.dims)
        if not out.fits(op.out.shape, mesh):
            continue
        yield Strategy("follow", tuple(ins), (out,)), _usage(op, mesh, tuple(ins), out, device)


def _usage(op: OpNode, mesh: Mesh, ins: tuple[Layout, ...], out: Layout, device: str) -> Usage:
    q, k, v = op.input_meta[:3]
    lq = ins[0]
    u = Usage(mesh, dtype=q.dtype)
    ql, kl, vl = (lay.local_shape(m.shape, mesh) for lay, m in zip(ins, (q, k, v)))
    rows = lq.local_numel(q.shape, mesh) // ql[-1]  # local (batch x heads x L) query rows
    heads_batch = rows // ql[-2]
    S = kl[-2]
    u.fwd_flops = matmul_flops(ql[-2], ql[-1], S, heads_batch) + matmul_flops(ql[-2], S, vl[-1], heads_batch)
    u.bwd_flops = SDPA_BWD_FLOPS_RATIO * u.fwd_flops
    moved = sum(local_bytes(m, lay, mesh) for m, lay in zip(op.input_meta, ins)) + local_bytes(op.out, out, mesh)
    u.fwd_bytes, u.bwd_bytes = moved, 2 * moved
    # Backward: the output's gradient and the fresh gradients of q, k and v, alive together (measured:
    # 131,072 B for four (8, 4, 16, 16) fp32 tensors on a torch TransformerEncoder fsdp rank).
    u.temp(local_bytes(op.out, out, mesh) + sum(local_bytes(m, lay, mesh) for m, lay in zip((q, k, v), ins[:3])))
    dropout = float(op.attrs.get("dropout_p", 0.0)) > 0
    if device == "cpu" and dropout:  # the math fallback, in fp32
        n_scores = rows * S
        u.save(f"{op.name}:math:{lq}", 4 * (3 * n_scores + rows * ql[-1] + heads_batch * S * (ql[-1] + vl[-1])))
        return u
    views = {i: (base, factor) for i, base, factor in op.attrs.get("saved_views", ()) or ()}
    repeats = dict(op.attrs.get("repeated_kv", ()) or ())
    for i, (m, lay) in enumerate(zip((q, k, v), ins[:3])):
        if i in views:  # a piece of a fused q/k/v output: the whole base stays alive
            base, factor = views[i]
            u.save(tensor_key(base, lay), factor * local_bytes(m, lay, mesh))
        elif i in repeats and lay.local_shape(m.shape, mesh)[-3] == repeats[i]:
            # repeat_kv of one local KV head: the reshape of the expand is a view of that head's storage
            # (when it arrives through a conversion it is a copy of its own: the plan's accounting saves it whole)
            u.save(tensor_key(op.inputs[i], lay), local_bytes(m, lay, mesh) // repeats[i])
        else:
            u.save(tensor_key(op.inputs[i], lay), local_bytes(m, lay, mesh))
    u.save(_output_key(op, out, mesh, device), local_bytes(op.out, out, mesh))
    u.save(f"{op.name}:lse:{lq}", _LSE_BYTES * rows)
    mask_i = op.attrs.get("mask")
    if mask_i is not None:
        m = op.input_meta[mask_i]
        key = tensor_key(op.inputs[mask_i], ins[3]) if m.dtype == q.dtype else f"{op.name}:mask:{ins[3]}"
        u.save(key, local_bytes(m, ins[3], mesh, itemsize=q.itemsize))
    if dropout and device == "cuda":
        u.save(f"{op.name}:rng", _RNG_BYTES)
    return u


def _output_key(op: OpNode, out: Layout, mesh: Mesh, device: str) -> str:
    """The saved output's key: that of the heads-merged view its only reader makes, when it has one on
    this device kind."""
    view = op.attrs.get("out_view")
    if view and device in view.get("devices", ()):
        lay = permute_layout(out, view["dims"])
        if not isinstance(lay, str):
            lay = reshape_layout(permute_meta(op.out.shape, view["dims"]), tuple(view["shape"]), lay, mesh)
        if not isinstance(lay, str):
            return tensor_key(view["node"], lay)
    return tensor_key(op.name, out)


def permute_meta(shape: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape[d] for d in dims)


def _output_strides(op: OpNode, by_name: dict[str, OpNode], device: str) -> tuple[int, ...] | None:
    """The strides of the attention output on this device kind (`cost_models.strides.runtime_strides`)."""
    return runtime_strides(op.name, by_name, device)


def _split_bases(op: OpNode, by_name: dict[str, OpNode]) -> tuple[tuple[int, str, int], ...]:
    """(input, base, factor) for each of q, k, v that is one piece of an equal split of its last dim
    (GPT-NeoX's fused q/k/v `chunk(3, -1)`): the kernel saves the view, which keeps the whole base
    tensor (`factor` times the piece) alive."""
    out = []
    for i in range(3):
        item = by_name.get(op.inputs[i])
        if item is None or item.kind != "getitem" or not item.inputs:
            continue
        split = by_name.get(item.inputs[0])
        if split is None or split.kind != "split" or not split.input_meta:
            continue
        base = split.input_meta[0]
        if split.attrs.get("dim", 0) % len(base.shape) == len(base.shape) - 1 and base.shape[:-1] == item.out.shape[:-1]:
            out.append((i, split.inputs[0], base.shape[-1] // item.out.shape[-1]))
    return tuple(out)


def _repeated_kv(op: OpNode, by_name: dict[str, OpNode]) -> tuple[tuple[int, int], ...]:
    """(input, n_rep) for k and v made by repeat_kv: an `expand` of a size-1 dim next to the KV heads,
    reshaped to Hkv * n_rep heads (HF's `x[:, :, None].expand(...).reshape(...)`, torchtitan's
    unsqueeze(3).expand().reshape() followed by transpose(1, 2)). When a rank holds one KV head the
    reshape is a view, so the kernel saves a view of that head's n_rep times smaller storage."""
    out = []
    for i in (1, 2):
        node = by_name.get(op.inputs[i]) if i < len(op.inputs) else None
        if node is not None and node.kind == "permute":
            node = by_name.get(node.inputs[0]) if node.inputs else None
        if node is None or node.kind != "reshape" or not node.inputs:
            continue
        exp = by_name.get(node.inputs[0])
        if exp is None or exp.kind != "expand" or not exp.input_meta:
            continue
        src, wide = exp.input_meta[0].shape, exp.out.shape
        grown = [d for d in range(len(wide)) if d < len(src) and src[d] == 1 and wide[d] > 1]
        if len(grown) == 1 and len(wide) == len(node.out.shape) + 1:
            out.append((i, int(wide[grown[0]])))
    return tuple(out)


def sdpa_output_view(op: OpNode, consumers: dict[str, list[OpNode]], by_name: dict[str, OpNode]) -> None:
    """Set `attrs["out_view"]` (see the module docstring) when q is stored heads-transposed (the kernel
    then writes the output in the same order) and the output is read only as transpose(1, 2)
    [-> contiguous] -> reshape to [*batch, L, H*E]; and `attrs["saved_views"]` (`_split_bases`)."""
    op.attrs.pop("out_view", None)
    repeats = _repeated_kv(op, by_name)
    if repeats:
        op.attrs["repeated_kv"] = repeats
    else:
        op.attrs.pop("repeated_kv", None)
    views = _split_bases(op, by_name)
    if views:
        op.attrs["saved_views"] = views
    else:
        op.attrs.pop("saved_views", None)
    views: dict[tuple[str, tuple[int, ...], tuple[int, ...]], list[str]] = {}
    for device in ("cpu", "cuda"):
        found = _merged_view(op, consumers, _output_strides(op, by_name, device))
        if found is not None:
            views.setdefault(found, []).append(device)
    if views:
        (node, dims, shape), devices = next(iter(views.items()))
        op.attrs["out_view"] = {"node": node, "dims": dims, "shape": shape, "devices": tuple(devices)}


def _merged_view(op: OpNode, consumers: dict[str, list[OpNode]], strides: tuple[int, ...] | None
                 ) -> tuple[str, tuple[int, ...], tuple[int, ...]] | None:
    """(reshape node, permute dims, its shape) when the output, with these strides, is read only through a
    permute and a reshape merging the heads back ([*batch, L, H*E], or [L*batch, H*E]) that torch views."""
    if strides is None:
        return None
    nd = len(op.out.shape)
    node, shape, dims = op, tuple(op.out.shape), None
    for _ in range(4):
        users = consumers.get(node.name, [])
        if len(users) != 1:
            return None
        node = users[0]
        if node.kind == "contiguous" and node.out.shape == node.input_meta[0].shape:
            if not is_contiguous(shape, strides):
                return None
            continue  # a copy of a contiguous tensor: the same storage
        if node.kind == "reshape" and node.out.shape == node.input_meta[0].shape:
            continue
        if node.kind == "permute" and dims is None:
            dims = tuple(node.attrs.get("dims", ()))
            if len(dims) != nd:
                return None
            shape, strides = tuple(shape[d] for d in dims), tuple(strides[d] for d in dims)
        elif node.kind == "reshape" and dims is not None:
            if node.out.shape[-1] != op.out.shape[-3] * op.out.shape[-1] \
                    or view_strides(shape, strides, node.out.shape) is None:
                return None
            return node.name, dims, tuple(node.out.shape)
        else:
            return None
    return None


