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
  on meta tensors under `torch.autograd.graph.saved_tensors_hooks`: the inputs it saves as they are, and
  the bytes of everything else it saves (parameters excluded: they are state), for the whole batch.
  Meta tensors make the estimate the same wherever the model lives (a plan and its `apply_plan` capture
  the same facts, so the fingerprints agree). When the run fails, every input and output is counted
  (`saved_source` = "conservative").
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from cost_models.ops import TensorMeta

__all__ = ["module_opaque_attrs", "call_opaque_attrs"]

_BATCH_FIRST_ALWAYS = (nn.modules.conv._ConvNd, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)
_RNNS = (nn.RNN, nn.LSTM, nn.GRU)


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


def _estimate_saved(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], inputs: list[torch.Tensor]
                    ) -> tuple[tuple[int, ...], int] | None:
    """(indices of inputs saved as they are, bytes of everything else saved) of one forward on meta
    tensors, parameters excluded; None when the module does not run on meta."""
    def meta(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            t = torch.empty(v.shape, dtype=v.dtype, device="meta")
            return t.requires_grad_(True) if t.is_floating_point() else t
        return v

    metas = {id(x): meta(x) for x in inputs}
    m_args = pytree.tree_map(lambda v: metas.get(id(v), meta(v)) if isinstance(v, torch.Tensor) else v, args)
    m_kwargs = pytree.tree_map(lambda v: metas.get(id(v), meta(v)) if isinstance(v, torch.Tensor) else v, kwargs)
    params = {n: torch.empty(p.shape, dtype=p.dtype, device="meta", requires_grad=True)
              for n, p in m.named_parameters()}
    buffers = {n: torch.empty(b.shape, dtype=b.dtype, device="meta") for n, b in m.named_buffers()}
    own = {id(t) for t in list(params.values()) + list(buffers.values())}
    order = [id(metas[id(x)]) for x in inputs]
    seen: dict[int, int] = {}
    saved_inputs: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(t) in own or id(base) in own:
            return t
        if id(t) in order:
            saved_inputs.add(order.index(id(t)))
        elif id(base) not in seen:
            seen[id(base)] = base.numel() * base.element_size()
        return t

    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            torch.func.functional_call(m, {**params, **buffers}, m_args, m_kwargs, strict=False)
    except Exception:  # a module that cannot run on meta: the caller counts conservatively
        return None
    return tuple(sorted(saved_inputs)), sum(seen.values())


def module_opaque_attrs(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], in_meta: list[TensorMeta],
                        out_meta: list[TensorMeta], inputs: list[torch.Tensor]) -> dict[str, Any]:
    """The attrs of an opaque op that calls leaf module `m` (see the module docstring). `args`/`kwargs`
    are the call's arguments (tensors with their traced shapes), `inputs` its activation inputs in order."""
    ins, outs, note = _batch_dims(m, in_meta, out_meta)
    est = _estimate_saved(m, args, kwargs, inputs)
    attrs: dict[str, Any] = {"module": type(m).__name__, "batch_dims": ins, "out_batch_dims": outs,
                             "batch_note": note,
                             "buffer_bytes": sum(b.numel() * b.element_size() for b in m.buffers())}
    attrs.update(_saved_attrs(est, in_meta, out_meta))
    return attrs


def call_opaque_attrs(name: str, kind: str, in_meta: list[TensorMeta], out_meta: list[TensorMeta],
                      param_shapes: list[tuple[int, ...]]) -> dict[str, Any]:
    """The attrs of an opaque op that is a function call reading parameters (e.g. an ATen convolution from
    torch.export, a multiply by a norm scale), classified as `kind` before: saved bytes counted
    conservatively; batch dims unknown, except for an element-wise op whose parameters broadcast over
    the leading dim of every tensor (x * scale): dim 0."""
    attrs: dict[str, Any] = {"module": name, "batch_dims": None, "out_batch_dims": None,
                             "batch_note": f"{name}: no known batch dim, its inputs are gathered whole",
                             "buffer_bytes": 0}
    nd = len(out_meta[0].shape) if len(out_meta) == 1 else 0
    if (kind == "elementwise" and nd >= 2 and all(len(s) < nd for s in param_shapes)
            and all(len(x.shape) == nd and x.shape[0] == out_meta[0].shape[0] for x in in_meta)):
        attrs.update(batch_dims=tuple(0 for _ in in_meta), out_batch_dims=(0,), batch_note="")
    attrs.update(_saved_attrs(None, in_meta, out_meta))
    return attrs


def _saved_attrs(est: tuple[tuple[int, ...], int] | None, in_meta: list[TensorMeta],
                 out_meta: list[TensorMeta]) -> dict[str, Any]:
    if est is None:  # conservative: every input and every output kept
        floats = tuple(i for i, x in enumerate(in_meta) if x.dtype.startswith(("float", "bfloat")))
        return {"saved_inputs": floats, "saved_bytes": sum(o.nbytes for o in out_meta), "saved_source": "conservative"}
    return {"saved_inputs": est[0], "saved_bytes": est[1], "saved_source": "estimated"}
