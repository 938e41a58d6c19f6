"""Graph hints: facts about an op's neighbours that its rule needs, written into `op.attrs`.

Rules see one op at a time, but two choices depend on the graph around it:

* `attrs["out_segments"] = k` on a linear whose output is split by a consumer into k equal
  parts on the feature (last) dim, as a fused q/k/v projection is: its feature-split strategies produce
  layouts with `interleave = k` and shard the weight rows per segment.
* `attrs["copies_inputs"] = (bool, ...)` on a matmul: True for an operand produced by a transpose /
  permute, which matmul copies to a contiguous tensor before the batched matmul and saves (measured with
  torch 2.13: the attention matmuls save copies of the transposed q, k, v). A saved copy is a tensor of
  its own (keyed by the matmul), not the producer's output that other ops might also save.

* `attrs["grad_inputs"] = (bool, ...)` on an element-wise op or a matmul: whether each input carries a
  gradient in backward (it is computed from a parameter). A broadcast input without one (an additive
  attention mask built from buffers, even in floating point), or a matmul operand without one, needs no
  gradient all-reduce. On a linear or a conv (set only when
  False, so ordinary graphs keep their signatures): its input is a graph input or computed from inputs
  alone, so the backward computes no input gradient: no dX reduction, no re-gathered weight for it.
* `attrs["no_grad"] = True` on an op whose output carries no gradient (no parameter, no input that
  carries one: the attention mask HF builds from arange/full/cumsum and the `where` that turns it into
  an additive bias): autograd records no node for it, so it saves nothing (measured: HF GPT-2's mask
  `where` saves no condition). Set only when true, so ordinary ops keep their signatures.
* `attrs["out_view"]` on an attention op whose output is only read through a permute and a reshape
  merging the heads back that torch can view in the order the kernel writes it (q's on CPU, [*batch, L,
  H, E] on CUDA; `devices` says where): the view shares its storage and a linear that saves it saves the
  same bytes (see `cost_models.strategies.sdpa`); with it `attrs["saved_views"]` (q/k/v pieces of a fused output)
  and `attrs["repeated_kv"]` (k/v made by repeat_kv's expand + reshape, views when a rank holds one KV head).
* `attrs["tied"] = ("weight", ...)` on an op whose parameters of those roles belong to an earlier op (a
  head tied to the token embedding): the earlier op stores them (one copy of the parameter, its
  gradient and optimizer state per rank, in its layout), so this op's rule counts no state for them.

Call `mark_graph_hints(ops)` once on the captured op list before enumerating strategies (the plan builder
does). Without it the rules assume no fused outputs and no copies.
"""

from __future__ import annotations

from collections import defaultdict

from cost_models.ops import OpNode
from cost_models.strategies.sdpa import sdpa_output_view

__all__ = ["mark_graph_hints", "equal_last_dim_split"]


def equal_last_dim_split(op: OpNode) -> int:
    """k when `op` is a split of its input's last dim into k > 1 equal parts, else 0."""
    if op.kind != "split" or not op.input_meta:
        return 0
    ndim = len(op.input_meta[0].shape)
    dim = op.attrs.get("dim", 0)
    sizes = list(op.attrs.get("sizes", ()) or ())
    if not sizes:
        sizes = [o.shape[dim % ndim] for o in op.outputs]
    if ndim == 0 or dim % ndim != ndim - 1 or len(sizes) < 2 or len(set(sizes)) != 1:
        return 0
    return len(sizes)


def mark_graph_hints(ops: list[OpNode]) -> None:
    """Set the `out_segments`, `copies_inputs`, `grad_inputs`, `no_grad` and `tied` hints (see the module
    docstring) in place; `ops` in execution order. Idempotent."""
    by_name = {op.name: op for op in ops}
    consumers: dict[str, list[OpNode]] = defaultdict(list)
    for op in ops:
        for src in op.inputs:
            consumers[src].append(op)
    flows: dict[str, bool] = {}
    for op in ops:  # execution order: an output carries a gradient when computed from a parameter
        flows[op.name] = bool(op.params) or any(flows.get(src, False) for src in op.inputs)
    owner: dict[str, str] = {}  # parameter name -> the first op that uses it
    for op in ops:
        if flows[op.name] or op.kind in ("input", "output"):
            op.attrs.pop("no_grad", None)
        else:
            op.attrs["no_grad"] = True
        tied = tuple(p.role for p in op.params if owner.setdefault(p.name, op.name) != op.name)
        if tied:
            op.attrs["tied"] = tied
        else:
            op.attrs.pop("tied", None)
        if op.kind == "elementwise":
            op.attrs["grad_inputs"] = tuple(flows.get(src, False) for src in op.inputs)
        if op.kind in ("linear", "conv"):
            if op.inputs and not flows.get(op.inputs[0], False):
                op.attrs["grad_inputs"] = (False,)
            else:
                op.attrs.pop("grad_inputs", None)
            segments = {equal_last_dim_split(c) for c in consumers[op.name]} - {0} if op.kind == "linear" else set()
            if len(segments) == 1:
                op.attrs["out_segments"] = segments.pop()
            else:
                op.attrs.pop("out_segments", None)
        elif op.kind == "attention":
            sdpa_output_view(op, consumers, by_name)
        elif op.kind == "matmul":
            op.attrs["grad_inputs"] = tuple(flows.get(src, False) for src in op.inputs)
            op.attrs["copies_inputs"] = tuple(
                src in by_name and by_name[src].kind == "permute" for src in op.inputs)
