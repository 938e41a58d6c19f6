"""Ops with parameters or buffers and no rule of their own ("opaque"): run whole on every rank.

Capture marks them (`planner/trace/opaque.py` records the facts read here; a family whose rule does not
price the parameters its ops hold, `cost_models.family.prices_params`, has them captured as opaque ops). Nothing they hold falls out of
the memory model: every parameter is model state (gradient and optimizer state included, bytes_per_param
each), every buffer is state at its own size. Two strategies per data-parallel choice:

* `replicate`: parameters whole on every rank; their gradients all-reduced over the axes splitting the
  batch (tag grad_weight).
* `fsdp`: each parameter stored split along its first dim that divides by the mesh size, over the batch
  axes then the others; all-gathered over the others and then over the batch axes before the call (tag
  weight) and kept gathered for backward (autograd saves what it saves of them); the gradient of the
  gathered parameter is reduce-scattered over the batch axes (tag grad_weight) and sliced to the shard.
  Parameters no dim of which divides stay whole.

Data-parallel choices: the op runs on this rank's block of the batch when capture knows each input's and
output's batch dim (`batch_dims`, `out_batch_dims`: convolutions, GroupNorm, recurrent layers,
MultiheadAttention); otherwise (an unknown module, BatchNorm, whose statistics mix the batch) its inputs
are gathered whole, priced on the edges into it, and every rank computes the whole output.

What it saves is an estimate (`saved_source` says how it was made): the inputs it keeps as they are, keyed
like every other saved input so a tensor two ops keep counts once, plus the bytes of everything else,
scaled to this rank's block of the batch; with fsdp, the gathered parameters too. Its time is its memory
traffic (FLOPs are not known).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from cost_models.family import OPAQUE, op_family
from cost_models.layout import Axes, Layout
from cost_models.mesh import Mesh
from cost_models.ops import DTYPE_BYTES, OpNode, ParamInfo
from cost_models.strategies.base import Candidates, Offer, Usage, axis_subsets, local_bytes, param_key, tensor_key
from cost_models.strategy import Strategy

__all__ = ["opaque_rule", "whole_offers", "fsdp_param_layout", "opaque_layouts"]

Facts = Mapping[str, Any]  # batch_dims, out_batch_dims, batch_note, buffer_bytes, saved_inputs, saved_bytes...


def fsdp_param_layout(p: ParamInfo, mesh: Mesh, dp: Axes = ()) -> Layout:
    """Where fsdp stores parameter `p`: its first dim that divides by the mesh size split over the batch
    axes `dp`, then the other axes (mesh order), or whole when no dim divides."""
    n = mesh.size(mesh.axis_names)
    axes = tuple(dp) + tuple(a for a in mesh.axis_names if a not in dp)
    for d, size in enumerate(p.shape):
        if n > 1 and size % n == 0:
            return Layout.shard(len(p.shape), d, axes)
    return Layout.replicated(len(p.shape))


def _batch_layout(shape: tuple[int, ...], dim: int | None, dp: Axes) -> Layout:
    if dim is None or not dp:
        return Layout.replicated(len(shape))
    return Layout.shard(len(shape), dim, dp)


def opaque_layouts(op: OpNode, dp: Axes, facts: Facts | None = None
                   ) -> tuple[tuple[Layout, ...], tuple[Layout, ...]] | None:
    """(input layouts, output layouts) of the op on a block of the batch split over `dp`; None when the op
    cannot split its batch that way. `facts`: the op's attrs unless given."""
    facts = op.attrs if facts is None else facts
    ins_b, outs_b = facts.get("batch_dims"), facts.get("out_batch_dims")
    if dp and (ins_b is None or outs_b is None):
        return None
    ins_b = ins_b or (None,) * len(op.input_meta)
    outs_b = outs_b or (None,) * len(op.outputs)
    ins = tuple(_batch_layout(m.shape, d, dp) for m, d in zip(op.input_meta, ins_b))
    outs = tuple(_batch_layout(m.shape, d, dp) for m, d in zip(op.outputs, outs_b))
    return ins, outs


def _dp_choices(op: OpNode, mesh: Mesh, facts: Facts) -> Iterator[Axes | str]:
    yield ()
    if facts.get("batch_dims") is None:
        note = facts.get("batch_note") or "no known batch dim"
        yield f"data parallel: {note}"
        return
    for dp in axis_subsets(mesh):
        layouts = opaque_layouts(op, dp, facts)
        if layouts is None:
            continue
        ins, outs = layouts
        metas = list(op.input_meta) + list(op.outputs)
        if all(lay.fits(m.shape, mesh) for lay, m in zip(ins + outs, metas)):
            yield dp
        else:
            yield f"data parallel over {''.join(dp)}: the batch does not divide"


def _usage(op: OpNode, mesh: Mesh, dp: Axes, ins: tuple[Layout, ...], outs: tuple[Layout, ...],
           fsdp: bool, facts: Facts) -> tuple[Usage, tuple[tuple[str, Layout], ...]]:
    u = Usage(mesh, dtype=op.outputs[0].dtype if op.outputs else "float32")
    u.buffer_bytes = int(facts.get("buffer_bytes", 0))
    params: list[tuple[str, Layout]] = []
    gathered = 0
    for i, p in enumerate(op.params):
        lay = fsdp_param_layout(p, mesh, dp) if fsdp else Layout.replicated(len(p.shape))
        params.append((param_key(op, i), lay))
        full = p.numel * _itemsize(p.dtype)
        u.param(lay.local_numel(p.shape, mesh))
        if not lay.is_replicated():  # gathered over the other axes, then over dp (layers3d.whole)
            gathered += full
            rest = tuple(a for a in mesh.axis_names if a not in dp)
            u.collective("all_gather", rest, full // mesh.size(dp), "forward", "weight")
            u.collective("all_gather", dp, full, "forward", "weight")
            u.collective("reduce_scatter", dp, full, "backward", "grad_weight")
        else:
            u.collective("all_reduce", dp, full, "backward", "grad_weight")
    if gathered:
        u.save(f"{op.name}:gathered_params", gathered)  # the gathered parameters, alive until backward
        u.temp(gathered)  # their whole gradients, before the slice back to the shards
    share = mesh.size(dp) if dp else 1
    for i in facts.get("saved_inputs", ()) or ():
        if i < len(op.input_meta):
            u.save(tensor_key(op.inputs[i], ins[i]), local_bytes(op.input_meta[i], ins[i], mesh))
    u.save(f"{op.name}:saved:{''.join(dp)}", int(facts.get("saved_bytes", 0)) // share)
    u.notes.append(f"{facts.get('module', op.target)} runs whole on each rank; saved activations "
                   f"{facts.get('saved_source', 'estimated')}, time from memory traffic")
    moved = sum(local_bytes(m, lay, mesh) for m, lay in zip(op.input_meta, ins)) + \
        sum(local_bytes(m, lay, mesh) for m, lay in zip(op.outputs, outs)) + gathered
    u.fwd_bytes, u.bwd_bytes = moved, 2 * moved
    u.fwd_flops = sum(lay.local_numel(m.shape, mesh) for m, lay in zip(op.outputs, outs))
    u.bwd_flops = 2 * u.fwd_flops
    return u, tuple(params)


def _itemsize(dtype: str) -> int:
    return DTYPE_BYTES[dtype]


def whole_offers(op: OpNode, mesh: Mesh, facts: Facts) -> Iterator[Offer | str]:
    """The strategies of `op` run whole (see the module docstring), from `facts` (what capture recorded
    for an opaque op; what a family that runs its ops whole knows of them, e.g. a convolution)."""
    for dp in _dp_choices(op, mesh, facts):
        if isinstance(dp, str):
            yield dp
            continue
        layouts = opaque_layouts(op, dp, facts)
        assert layouts is not None  # _dp_choices yields only splits the op allows
        ins, outs = layouts
        schemes = ["replicate"]
        if op.params and any(not fsdp_param_layout(p, mesh, dp).is_replicated() for p in op.params):
            schemes.append("fsdp")
        elif op.params:
            yield "fsdp: no parameter dim divides by the mesh size"
        for scheme in schemes:
            u, params = _usage(op, mesh, dp, ins, outs, scheme == "fsdp", facts)
            opts = (("dp", dp),) if dp else ()
            yield Strategy(scheme, ins, outs or (Layout(()),), params, opts), u


# Captured by fallback (no op names, no module types): every op holding parameters or buffers that no
# family prices (`cost_models.family.prices_params`).
@op_family(OPAQUE, prices_params=True)
def opaque_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    yield from whole_offers(op, mesh, op.attrs)
