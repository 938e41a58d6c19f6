"""Linear ops (y = x W^T + b): every scheme of docs/ARCHITECTURE.md on every axis assignment.

Each strategy is described by a `LinearPlan`: the layout x arrives in and the layout the local matmul
uses (after its forward gathers), the stored and used layouts of W (in [N, K] orientation), and the layout
y leaves in. Everything else follows from those layouts through `plan_redistribution`, so the collectives
are the ones the runtime runs:

    forward    x_in -> x_eff (input), W_store -> W_eff (weight), y_eff -> y_out (output)
    backward   dY: the reverse of the output steps (grad_output); dX: partial over the axes that split
               N -> x_in (grad_input); dW: partial over x_eff's token axes -> reduce-scatter over the
               axes W_store adds to W_eff, all-reduce over the rest (grad_weight); db: all-reduce over
               y_out's token axes (grad_bias)

with y_eff = (x_eff's token splits, W_eff's N splits) + partial over the axes splitting K.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from cost_models.layout import Axes, Layout
from cost_models.memory import conversion_working_set
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, ParamInfo, TensorMeta
from cost_models.redistribution import backward_steps, plan_redistribution
from cost_models.strategies import register
from cost_models.strategies.base import (
    Candidates,
    Offer,
    Usage,
    axis_subsets,
    cube_permutations,
    local_bytes,
    make_options,
    ordered_pairs,
    param_key,
    rest_axes,
    tensor_key,
    token_layout,
)
from cost_models.strategy import Strategy

__all__ = ["LinearPlan", "linear_rule", "linear_usage", "matmul_param_layout"]


@dataclass(frozen=True)
class LinearPlan:
    """The layouts of one linear strategy (W in [N, K] orientation: w_n / w_k are the axes splitting N / K)."""

    x_in: Layout
    x_eff: Layout
    w_store: tuple[Axes, Axes]
    w_eff: tuple[Axes, Axes]
    y_out: Layout
    save_input: str = "eff"          # "eff": the tensor the matmul used; "in": the shard x arrived as
    regather_weight: bool = False    # fsdp / weight_shard: gather W again in backward instead of saving it
    interleave: int = 1


def matmul_param_layout(op: OpNode, n_axes: Axes, k_axes: Axes, interleave: int = 1) -> Layout:
    """W's layout in its stored orientation: [N, K] for nn.Linear, [K, N] for HF Conv1D
    (attrs["weight_transposed"]). Interleave is expressible only when N is the last stored dim."""
    if op.attrs.get("weight_transposed"):
        return Layout((k_axes, n_axes), interleave=interleave if n_axes else 1)
    return Layout((n_axes, k_axes))


def _bias_layout(plan: LinearPlan) -> Layout:
    feat = plan.y_out.dims[-1]
    return Layout((feat,), interleave=plan.interleave if feat else 1)


def _weight(op: OpNode) -> tuple[int, ParamInfo]:
    for j, p in enumerate(op.params):
        if p.role == "weight":
            return j, p
    raise ValueError(f"linear op {op.name} has no weight parameter (params: {[p.name for p in op.params]})")


def _bias(op: OpNode) -> tuple[int, ParamInfo] | None:
    for j, p in enumerate(op.params):
        if p.role == "bias":
            return j, p
    return None


def _divides(n: int, mesh: Mesh, axes: Axes, segments: int = 1) -> bool:
    return n % (mesh.size(axes) * segments) == 0


def _plans(op: OpNode, mesh: Mesh) -> Iterator[tuple[str, dict, LinearPlan] | str]:
    """Every (scheme, options, plan) the shapes allow, and a reason for each that they do not."""
    x, y = op.input_meta[0], op.out
    K, N = x.shape[-1], y.shape[-1]
    seg = int(op.attrs.get("out_segments", 1) or 1)
    every = mesh.axis_names

    def tok(meta: TensorMeta, axes: Axes, feat: Axes = (), seq: Axes = (), inter: int = 1) -> Layout | None:
        return token_layout(meta.shape, axes, mesh, feat, seq, inter)

    def no_tokens(label: str, axes: Axes) -> str:
        return (f"{label}: tokens {x.shape[:-1]} cannot be split over axes {''.join(axes)} "
                f"({mesh.size(axes)} ways)")

    def feat_reason(label: str, what: str, n: int, axes: Axes, segments: int = 1) -> str:
        seg_txt = f" in {segments} segments" if segments > 1 else ""
        return (f"{label}: {what} {n}{seg_txt} not divisible by {mesh.size(axes) * segments} "
                f"(axis {''.join(axes)})")

    # replicate: tokens over every axis; and fully replicated (every rank computes everything).
    x_all, y_all = tok(x, every), tok(y, every)
    if x_all and y_all:
        yield "replicate", {"dp": every}, LinearPlan(x_all, x_all, ((), ()), ((), ()), y_all)
        # fsdp: W's N dim split over every axis, else its K dim (as layers3d shards it).
        for dim, size in enumerate((N, K)):
            if size % mesh.world_size == 0:
                w_store = (every, ()) if dim == 0 else ((), every)
                yield "fsdp", {"dp": every, "shard_dim": dim}, LinearPlan(
                    x_all, x_all, w_store, ((), ()), y_all, regather_weight=True)
                break
        else:
            yield f"fsdp: weight {N}x{K} divisible by {mesh.world_size} on neither dim"
    else:
        yield no_tokens("replicate/fsdp", every)
    rep_x, rep_y = Layout.replicated(len(x.shape)), Layout.replicated(len(y.shape))
    yield "replicate", {"dp": ()}, LinearPlan(rep_x, rep_x, ((), ()), ((), ()), rep_y)

    for T in axis_subsets(mesh):
        dp = rest_axes(mesh, T)
        t_opts = {"T": T, "dp": dp}
        x_dp, y_dp = tok(x, dp), tok(y, dp)
        if x_dp is None or y_dp is None:
            yield no_tokens(f"1d[T={''.join(T)}]", dp)
            continue
        # 1d_col: N over T.
        if _divides(N, mesh, T, seg):
            y_col = tok(y, dp, T, inter=seg)
            yield "1d_col", {**t_opts, "sp": False}, LinearPlan(x_dp, x_dp, (T, ()), (T, ()), y_col, interleave=seg)
            x_sp = tok(x, dp, seq=T)
            if x_sp is None:
                yield f"1d_col[T={''.join(T)},sp]: sequence {x.shape[:-1]} not divisible by {mesh.size(T)}"
            else:
                for save in ("gathered", "shard"):
                    yield "1d_col", {**t_opts, "sp": True, "save_input": save}, LinearPlan(
                        x_sp, x_dp, (T, ()), (T, ()), y_col, "eff" if save == "gathered" else "in",
                        interleave=seg)
        else:
            yield feat_reason(f"1d_col[T={''.join(T)}]", "out_features", N, T, seg)
        # 1d_row: K over T, y reduced over T.
        if _divides(K, mesh, T):
            x_row = tok(x, dp, T)
            yield "1d_row", {**t_opts, "sp": False}, LinearPlan(x_row, x_row, ((), T), ((), T), y_dp)
            y_sp = tok(y, dp, seq=T)
            if y_sp is None:
                yield f"1d_row[T={''.join(T)},sp]: sequence {y.shape[:-1]} not divisible by {mesh.size(T)}"
            else:
                yield "1d_row", {**t_opts, "sp": True}, LinearPlan(x_row, x_row, ((), T), ((), T), y_sp)
        else:
            yield feat_reason(f"1d_row[T={''.join(T)}]", "in_features", K, T)

    for r, c in ordered_pairs(mesh):
        label = f"2d[roles={r}{c}]"
        dp = rest_axes(mesh, (r, c))
        if not _divides(K, mesh, (c,)) or not _divides(K, mesh, (r,)):
            yield feat_reason(label, "in_features", K, (c,) if not _divides(K, mesh, (c,)) else (r,))
            continue
        if not _divides(N, mesh, (c,), seg):
            yield feat_reason(label, "out_features", N, (c,), seg)
            continue
        x_in, x_eff = tok(x, dp + (r,), (c,)), tok(x, dp + (r,))
        y_out = tok(y, dp + (r,), (c,), inter=seg)
        if not (x_in and x_eff and y_out):
            yield no_tokens(label, dp + (r,))
            continue
        for save in ("gathered", "shard"):
            yield "2d", {"roles": (r, c), "dp": dp, "save_input": save}, LinearPlan(
                x_in, x_eff, ((c,), (r,)), ((c,), ()), y_out, "eff" if save == "gathered" else "in", interleave=seg)

    for w, i, o in cube_permutations(mesh):
        roles = (w, i, o)
        dp = rest_axes(mesh, roles)
        label = f"3d[roles={w}{i}{o}]"
        if not _divides(K, mesh, (o, w)):
            yield feat_reason(label, "in_features", K, (o, w))
        elif not _divides(N, mesh, (i,), seg):
            yield feat_reason(label, "out_features", N, (i,), seg)
        else:
            x_in, x_eff = tok(x, dp + (w, i), (o,)), tok(x, dp + (w,), (o,))
            y_out = tok(y, dp + (w, o), (i,), inter=seg)
            if not (x_in and x_eff and y_out):
                yield no_tokens(label, dp + (w, i))
            else:
                for save in ("gathered", "shard"):
                    yield "3d", {"roles": roles, "dp": dp, "save_input": save}, LinearPlan(
                        x_in, x_eff, ((i,), (o, w)), ((i,), (o,)), y_out, "eff" if save == "gathered" else "in",
                        interleave=seg)
        m, k, n = roles
        label = f"3d_allreduce[roles={m}{k}{n}]"
        if not _divides(K, mesh, (k,)):
            yield feat_reason(label, "in_features", K, (k,))
            continue
        if not _divides(N, mesh, (n,), seg):
            yield feat_reason(label, "out_features", N, (n,), seg)
            continue
        x_in, y_out = tok(x, dp + (m,), (k,)), tok(y, dp + (m,), (n,), inter=seg)
        if not (x_in and y_out):
            yield no_tokens(label, dp + (m,))
            continue
        yield "3d_allreduce", {"roles": roles, "dp": dp, "weight_shard": False}, LinearPlan(
            x_in, x_in, ((n,), (k,)), ((n,), (k,)), y_out, interleave=seg)
        if _divides(K, mesh, (k, m)):
            yield "3d_allreduce", {"roles": roles, "dp": dp, "weight_shard": True}, LinearPlan(
                x_in, x_in, ((n,), (k, m)), ((n,), (k,)), y_out, regather_weight=True, interleave=seg)
        else:
            yield feat_reason(label + "[weight_shard]", "in_features", K, (k, m))


def linear_usage(op: OpNode, plan: LinearPlan, mesh: Mesh) -> Usage:
    """Elements, bytes, FLOPs and collectives of one linear strategy (see the module docstring)."""
    x, y = op.input_meta[0], op.out
    wj, wp = _weight(op)
    bias = _bias(op)
    u = Usage(mesh, dtype=x.dtype)
    w_shape_nk = (y.shape[-1], x.shape[-1])
    w_store = Layout(plan.w_store)
    w_eff = Layout(plan.w_eff)
    w_item = TensorMeta(wp.shape, wp.dtype).itemsize

    # y_eff: tokens as x_eff, features as W_eff's N, partial over the axes splitting K.
    k_axes = plan.x_eff.dims[-1]
    if k_axes != plan.w_eff[1]:
        raise AssertionError(f"{op.name}: x_eff splits K over {k_axes}, W_eff over {plan.w_eff[1]}")
    y_eff = Layout(plan.x_eff.dims[:-1] + (plan.w_eff[0],), partial=k_axes,
                   interleave=plan.interleave if plan.w_eff[0] else 1)

    # Forward collectives.
    x_gather = plan_redistribution(x.shape, x.itemsize, plan.x_in, plan.x_eff, mesh)
    w_gather = plan_redistribution(w_shape_nk, w_item, w_store, w_eff, mesh)
    y_reduce = plan_redistribution(y.shape, y.itemsize, y_eff, plan.y_out, mesh)
    u.steps(x_gather, "forward", "input")
    u.steps(w_gather, "forward", "weight")
    u.steps(y_reduce, "forward", "output")

    # Backward collectives.
    u.steps(backward_steps(y_reduce, y.shape, y.itemsize, mesh), "backward", "grad_output")
    if plan.save_input == "in" and x_gather:
        u.steps(x_gather, "backward", "input")
    # No input gradient (the input is computed from graph inputs alone, hint grad_inputs): backward
    # neither re-gathers W for dX nor reduces dX.
    input_grad = bool((op.attrs.get("grad_inputs") or (True,))[0])
    if plan.regather_weight and input_grad:
        u.steps(w_gather, "backward", "weight")
    dx_partial = Layout(plan.x_eff.dims, partial=plan.w_eff[0])
    dx_reduce = plan_redistribution(x.shape, x.itemsize, dx_partial, plan.x_in, mesh)
    if input_grad:
        u.steps(dx_reduce, "backward", "grad_input")
    token_axes = tuple(a for d in plan.x_eff.dims[:-1] for a in d)
    extra = tuple(a for d in range(2) for a in plan.w_store[d] if a not in plan.w_eff[d])
    if set(extra) - set(token_axes):
        raise AssertionError(f"{op.name}: W sharded over {extra}, not all token axes of {plan.x_eff}")
    w_eff_bytes = local_bytes(w_shape_nk, w_eff, mesh, w_item)
    w_store_bytes = local_bytes(w_shape_nk, w_store, mesh, w_item)
    u.collective("reduce_scatter", extra, w_eff_bytes, "backward", "grad_weight")
    u.collective("all_reduce", tuple(a for a in token_axes if a not in extra), w_store_bytes, "backward",
                 "grad_weight")

    # Parameters (and the bias, stored like y's feature dim, its gradient summed over y's token axes).
    # A weight tied to an earlier op's parameter (hint tied) is that op's state, not this one's.
    u.param_elems = 0 if "weight" in op.attrs.get("tied", ()) else w_store.local_numel(w_shape_nk, mesh)
    if bias is not None:
        b_layout = _bias_layout(plan)
        b_meta = TensorMeta(bias[1].shape, bias[1].dtype)
        u.param_elems += 0 if "bias" in op.attrs.get("tied", ()) else b_layout.local_numel(b_meta.shape, mesh)
        y_token_axes = tuple(a for d in plan.y_out.dims[:-1] for a in d)
        u.collective("all_reduce", y_token_axes, local_bytes(b_meta, b_layout, mesh), "backward", "grad_bias")

    # Saved tensors.
    x_in_bytes, x_eff_bytes = local_bytes(x, plan.x_in, mesh), local_bytes(x, plan.x_eff, mesh)
    if plan.save_input == "in" or plan.x_in == plan.x_eff:
        u.save(tensor_key(op.inputs[0], plan.x_in), x_in_bytes)
    else:
        u.save(f"{op.name}:input:{plan.x_eff}", x_eff_bytes)
    w_gathered = bool(w_gather)
    if w_gathered and not plan.regather_weight:
        u.save(f"{op.name}:weight:{w_eff}", w_eff_bytes)

    # Transient buffers, per phase (temporaries alive together that nothing else counts), as layers3d's
    # ParallelLinear allocates them. Forward: a gathered input or weight that is not saved, and the
    # reduction of the partial output (the partial, the collective's staging and the reduced output:
    # cost_models.memory.conversion_working_set). Backward: dY as it arrives (and gathered), dX as the
    # matmul writes it and its reduction, and dW's buffers beyond the gradient autograd keeps, when dW is
    # transposed back (a weight stored (in, out), as HF Conv1D does), reduce-scattered or all-reduced
    # (layers3d.comm copies before reducing). Measured on HF GPT-2 tiny's MLP projection (replicated,
    # (128, 512) input): dY 65,536 + dX 262,144 + dW copy 262,144 B.
    y_eff_bytes, y_out_bytes = local_bytes(y, y_eff, mesh), local_bytes(y, plan.y_out, mesh)
    fwd = (x_eff_bytes if x_gather and plan.save_input == "in" else 0) \
        + (w_eff_bytes if w_gathered and plan.regather_weight else 0) \
        + conversion_working_set(y_reduce, y.shape, y.itemsize, mesh)
    dw_ar = tuple(a for a in token_axes if a not in extra)
    # dW's chain: the matmul's result (and its transposed copy), its reduce-scatter to the stored shard, its
    # all-reduce copy; the last buffer is the gradient autograd keeps (counted with the states).
    dw_chain = max(2 * w_eff_bytes if op.attrs.get("weight_transposed") else w_eff_bytes,
                   conversion_working_set(backward_steps(w_gather, w_shape_nk, w_item, mesh), w_shape_nk, w_item,
                                          mesh) if w_gather else 0,
                   2 * w_store_bytes if dw_ar else 0)
    dx_ws = (conversion_working_set(dx_reduce, x.shape, x.itemsize, mesh) or x_in_bytes) if input_grad else 0
    bwd = y_out_bytes + (y_eff_bytes if y_eff_bytes > y_out_bytes else 0) + dx_ws \
        + (x_eff_bytes if x_gather and plan.save_input == "in" else 0) \
        + (w_eff_bytes if w_gathered and plan.regather_weight else 0) \
        + max(0, dw_chain - w_store_bytes)
    u.temp(max(fwd, bwd))

    # FLOPs (torch.utils.flop_counter: 2 m k n forward, twice that backward) and memory traffic.
    m_loc = plan.x_eff.local_numel(x.shape, mesh) // (x.shape[-1] // mesh.size(k_axes))
    k_loc = x.shape[-1] // mesh.size(k_axes)
    n_loc = y.shape[-1] // mesh.size(plan.w_eff[0])
    u.fwd_flops = 2 * m_loc * k_loc * n_loc + (m_loc * n_loc if bias else 0)
    u.bwd_flops = (4 if input_grad else 2) * m_loc * k_loc * n_loc + (m_loc * n_loc if bias else 0)
    traffic = x_eff_bytes + local_bytes(w_shape_nk, w_eff, mesh, x.itemsize) + y_eff_bytes
    u.fwd_bytes, u.bwd_bytes = traffic, 2 * traffic
    return u


@register("linear")
def linear_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    """Offers every linear scheme the shapes allow (input candidates are not needed: a linear fixes the
    layout its input must arrive in, and the edge from the producer pays any conversion)."""
    wj, _ = _weight(op)
    bias = _bias(op)
    for item in _plans(op, mesh):
        if isinstance(item, str):
            yield item
            continue
        scheme, opts, plan = item
        if plan.interleave > 1:
            opts = {**opts, "interleave": plan.interleave}
        params = [(param_key(op, wj), matmul_param_layout(op, *plan.w_store, plan.interleave))]
        if bias is not None:
            params.append((param_key(op, bias[0]), _bias_layout(plan)))
        strategy = Strategy(scheme, (plan.x_in,), (plan.y_out,), tuple(params), make_options(**opts))
        yield strategy, linear_usage(op, plan, mesh)
