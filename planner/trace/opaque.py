"""Facts about ops the cost model has no rule for but that hold parameters or buffers ("opaque" ops).

Such an op runs whole on every rank (`cost_models/strategies/opaque.py` prices it, `layers3d/whole.py`
runs it), so the planner needs, per op, what a rule would otherwise know:

* `batch_dims` / `out_batch_dims`: for each input and output, the dim along which the op is independent
  (samples of a batch), or None. With them the op may run on a data-parallel block of the batch; without
  them (an unknown module) its inputs are gathered whole. Known for torch's convolutions, GroupNorm,
  InstanceNorm, recurrent layers and MultiheadAttention; BatchNorm in training is *not* batch-independent
  (its statistics mix the samples), so it keeps its batch whole and says so in `batch_note`.
* `buffer_bytes`: the module's buffers (running statistics), model state that is not trained.
* `saved_inputs` / `saved_bytes`: what autograd keeps for backward, estimated by running the module once
  under `torch.autograd.graph.saved_tensors_hooks`: the inputs it saves as they are, and the bytes of
  everything else it saves (parameters excluded: they are state), for the whole batch. The run uses
  fresh tensors of the traced shapes, never the model's own, so the estimate is the same wherever the
  model lives (a plan and its `apply_plan` capture the same facts, so the fingerprints agree): one and
  two samples of the batch on CPU (zeros), extrapolated linearly to the batch, when the batch dims are
  known and the module is small (CPU kernels save what the meta decompositions do not: an nn.LSTM about twice as much), else the
  whole batch on meta tensors. CUDA kernels (cuDNN's LSTM) may save other amounts. When the run fails,
  every input and output is counted (`saved_source` = "conservative").
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from cost_models.family import families
from cost_models.ops import TensorMeta

__all__ = ["module_opaque_attrs", "call_opaque_attrs"]

_BATCH_FIRST_ALWAYS = (nn.modules.conv._ConvNd, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)
_RNNS = (nn.RNN, nn.LSTM, nn.GRU)
# op kinds whose autograd saves no tensor: views, their copies and concatenation (sizes only)
_SAVE_NOTHING = ("reshape", "permute", "expand", "getitem", "split", "contiguous", "cat")


def _batch_dims(m: nn.Module, in_meta: list[TensorMeta], out_meta: list[TensorMeta]
                ) -> tuple[tuple[int | None, ...] | None, tuple[int | None, ...] | None, str]:
    """(per-input batch dim, per-output batch dim, note); (None, None, why) when the op needs its batch whole."""
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return None, None, (f"{type(m).__name__}: batch statistics mix the samples, so its batch is kept whole "
                            "(no synchronised statistics)")
    if isinstance(m, _BATCH_FIRST_ALWAYS):
        return tuple(0 for _ in in_meta), tuple(0 for _ in out_meta), ""
    if isinstance(m, _RNNS):
        b = 0 if m.batch_first else 1
        if in_meta and len(in_meta[0].shape) != 3:
            return None, None, f"{type(m).__name__} on an unbatched input"
        # input (and output) [B, T, F] or [T, B, F]; states h0/c0 and hn/cn [layers, B, H]
        return (b,) + (1,) * (len(in_meta) - 1), (b,) + (1,) * (len(out_meta) - 1), ""
    if isinstance(m, nn.MultiheadAttention):
        b = 0 if m.batch_first else 1
        ins = tuple(b if len(x.shape) == 3 else None for x in in_meta)
        # outputs: attn_output [B, T, E] (or [T, B, E]); attention weights [B, T, S] (batch first always)
        outs = tuple(b if k == 0 else 0 for k in range(len(out_meta)))
        if any(len(x.shape) != 3 for x in in_meta[:3]):
            return None, None, "MultiheadAttention with a mask input or an unbatched query"
        return ins, outs, ""
    return None, None, f"{type(m).__name__}: no known batch dim, its inputs are gathered whole"


# A module whose parameters and two-sample inputs fit in this many bytes is run on CPU to see what it saves
# (CPU kernels save what the meta decompositions do not: an LSTM keeps about twice as much); larger ones
# are estimated on meta tensors.
_REAL_RUN_BYTES = 256 << 20


def _estimate_saved(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], inputs: list[torch.Tensor],
                    batch_dims: tuple[int | None, ...] | None) -> tuple[tuple[int, ...], int] | None:
    """(indices of inputs saved as they are, bytes of everything else saved) of one forward, parameters
    excluded; None when the module does not run. With known batch dims and a small module: runs of one
    and of two samples on CPU (zeros), extrapolated linearly to the batch (what a module saves is a
    fixed part plus a part per sample); otherwise the whole batch on meta tensors."""
    dims = {id(x): (batch_dims[i] if batch_dims and i < len(batch_dims) else None) for i, x in enumerate(inputs)}
    sizes = {x.shape[d] for x in inputs if (d := dims[id(x)]) is not None}
    batch = max(sizes) if len(sizes) == 1 else 0
    small = sum(p.numel() * p.element_size() for p in m.parameters()) + \
        sum(2 * x.numel() * x.element_size() // max(batch, 1) for x in inputs) <= _REAL_RUN_BYTES
    if batch_dims is None or not batch or not small:
        return _saved_once(m, args, kwargs, inputs, dims, None, "meta")
    one = _saved_once(m, args, kwargs, inputs, dims, 1, "cpu")
    if one is None or batch == 1:
        return one
    two = _saved_once(m, args, kwargs, inputs, dims, 2, "cpu")
    if two is None:
        return None
    return one[0], one[1] + (two[1] - one[1]) * (batch - 1)


def _saved_once(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], inputs: list[torch.Tensor],
                dims: dict[int, int | None], samples: int | None, device: str) -> tuple[tuple[int, ...], int] | None:
    """One forward of `m` on fresh zero tensors on `device` (with `samples` along each input's batch dim
    when given), parameters excluded: (inputs saved as they are, bytes of everything else saved)."""
    def fresh(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            shape, d = list(v.shape), dims.get(id(v))
            if samples is not None and d is not None:
                shape[d] = samples
            t = torch.zeros(shape, dtype=v.dtype, device=device)
            return t.requires_grad_(True) if t.is_floating_point() else t
        return v

    made = {id(x): fresh(x) for x in inputs}
    f_args = pytree.tree_map(lambda v: made.get(id(v), fresh(v)) if isinstance(v, torch.Tensor) else v, args)
    f_kwargs = pytree.tree_map(lambda v: made.get(id(v), fresh(v)) if isinstance(v, torch.Tensor) else v, kwargs)
    params = {n: torch.zeros(p.shape, dtype=p.dtype, device=device, requires_grad=True)
              for n, p in m.named_parameters()}
    buffers = {n: torch.zeros(b.shape, dtype=b.dtype, device=device) for n, b in m.named_buffers()}
    own = {id(t) for t in list(params.values()) + list(buffers.values())}
    order = [id(made[id(x)]) for x in inputs]
    seen: dict[int, int] = {}
    saved_inputs: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(t) in own or id(base) in own:
            return t
        if id(t) in order:
            saved_inputs.add(order.index(id(t)))
        elif id(base) not in seen:  # the tensor is kept alive by autograd: its id is not reused
            seen[id(base)] = base.numel() * base.element_size()
        return t

    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            torch.func.functional_call(m, {**params, **buffers}, f_args, f_kwargs, strict=False)
    except Exception:  # a module that cannot run so: the caller counts conservatively
        return None
    return tuple(sorted(saved_inputs)), sum(seen.values())


def module_opaque_attrs(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], in_meta: list[TensorMeta],
                        out_meta: list[TensorMeta], inputs: list[torch.Tensor]) -> dict[str, Any]:
    """The attrs of an opaque op that calls leaf module `m` (see the module docstring). `args`/`kwargs`
    are the call's arguments (tensors with their traced shapes), `inputs` its activation inputs in order."""
    ins, outs, note = _batch_dims(m, in_meta, out_meta)
    est = _estimate_saved(m, args, kwargs, inputs, ins)
    attrs: dict[str, Any] = {"module": type(m).__name__, "batch_dims": ins, "out_batch_dims": outs,
                             "batch_note": note,
                             "buffer_bytes": sum(b.numel() * b.element_size() for b in m.buffers())}
    attrs.update(_saved_attrs(est, in_meta, out_meta))
    return attrs


def call_opaque_attrs(name: str, kind: str, in_meta: list[TensorMeta], out_meta: list[TensorMeta],
                      param_shapes: list[tuple[int, ...]], family_attrs: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
    """The attrs of an opaque op that is a function call reading parameters (e.g. a multiply by a norm
    scale), classified as `kind` (with `family_attrs`) before: batch dims unknown, except for an
    element-wise op whose parameters broadcast over the leading dim of every tensor (x * scale): dim 0.
    Saved bytes: none for shape ops (`_SAVE_NOTHING`); what the element-wise family's classifier says it saves (`saves`, `saves_output`: the
    activation inputs and the output autograd keeps; T5LayerNorm's `weight * x` keeps x), else
    conservatively every floating input and every output."""
    attrs: dict[str, Any] = {"module": name, "batch_dims": None, "out_batch_dims": None,
                             "batch_note": f"{name}: no known batch dim, its inputs are gathered whole",
                             "buffer_bytes": 0}
    nd = len(out_meta[0].shape) if len(out_meta) == 1 else 0
    if (kind == "elementwise" and nd >= 2 and all(len(s) < nd for s in param_shapes)
            and all(len(x.shape) == nd and x.shape[0] == out_meta[0].shape[0] for x in in_meta)):
        attrs.update(batch_dims=tuple(0 for _ in in_meta), out_batch_dims=(0,), batch_note="")
    fam = family_attrs or {}
    # shape ops save nothing, their backward needs sizes only (ViT's cls_token.expand(B, -1, -1), which
    # its family's classifier declines for a parameter input: its op name says what it is)
    if kind in _SAVE_NOTHING or any(f.kind in _SAVE_NOTHING and name in f.ops for f in families()):
        attrs.update(saved_inputs=(), saved_source="rule", saved_bytes=0)
    elif kind == "elementwise" and "saves" in fam:
        attrs.update(saved_inputs=tuple(fam["saves"]), saved_source="rule",
                     saved_bytes=sum(o.nbytes for o in out_meta) if fam.get("saves_output") else 0)
    else:
        attrs.update(_saved_attrs(None, in_meta, out_meta))
    return attrs


def _saved_attrs(est: tuple[tuple[int, ...], int] | None, in_meta: list[TensorMeta],
                 out_meta: list[TensorMeta]) -> dict[str, Any]:
    if est is None:  # conservative: every input and every output kept
        floats = tuple(i for i, x in enumerate(in_meta) if x.dtype.startswith(("float", "bfloat")))
        return {"saved_inputs": floats, "saved_bytes": sum(o.nbytes for o in out_meta), "saved_source": "conservative"}
    return {"saved_inputs": est[0], "saved_bytes": est[1], "saved_source": "estimated"}
