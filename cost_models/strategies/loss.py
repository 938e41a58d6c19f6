"""Cross-entropy of logits [*tokens, V] against integer targets [*tokens].

When the vocabulary dim of the logits is split over axes A (a vocab-parallel head), the loss is computed
without gathering the logits (Megatron's vocab-parallel cross-entropy): three all-reduces over A of one
fp32 per local token (the max, the target logit, the sum of exponentials; tag stats). Otherwise it is
local. The targets must be split like the logits' token dims. With reduction "mean"/"sum" over tokens
split over some axes, (loss sum, token count) are all-reduced over them in forward (two fp32, tag output)
so every rank holds the complete loss. Saves its log-softmax output (the logits' size and dtype) and the targets; an
`nll_loss` (attrs["fn"]) reads log-probabilities, saves its input and needs only the target all-reduce.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cost_models.calls import Call
from cost_models.family import flops_per_elem, op_family
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode
from cost_models.strategies.base import Candidates, Offer, Usage, input_candidates_for, local_bytes, tensor_key
from cost_models.strategy import Strategy

__all__ = ["cross_entropy_rule", "cross_entropy_call", "runs_as_traced", "VOCAB_STATS"]

VOCAB_STATS = ("max", "target_logit", "sum_exp")
_STAT_BYTES = 4  # one fp32 per token per statistic
_TOTAL_BYTES = 8  # the loss sum and the count of counted tokens, fp32 (as layers3d.loss reduces them)


# cross_entropy_loss / nll_loss at ATen level encode the reduction as an int.
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def cross_entropy_call(call: Call) -> dict[str, Any]:
    """F.cross_entropy / F.nll_loss and their ATen forms (which take the reduction as an int)."""
    if call.level == "aten" or call.op in ("cross_entropy_loss", "nll_loss_nd", "nll_loss2d"):
        # aten.cross_entropy_loss / nll_loss(self, target, weight, reduction, ignore_index)
        reduction = call.arg(3, "reduction", 1)
        ignore_index = call.arg(4, "ignore_index", -100)
    else:  # F.cross_entropy / F.nll_loss(input, target, weight, size_average, ignore_index, reduce, reduction)
        reduction = call.arg(6, "reduction", "mean")
        ignore_index = call.arg(4, "ignore_index", -100)
    reduction = _REDUCTIONS.get(reduction, reduction) if isinstance(reduction, int) else reduction
    fn = "nll_loss" if call.op.startswith("nll") else "cross_entropy"
    return {"fn": fn, "ignore_index": int(ignore_index), "reduction": str(reduction)}


def runs_as_traced(op: OpNode, lay: Layout) -> bool:
    """Whether a cross-entropy over logits in `lay` runs as traced (torch's own loss) rather than as
    `layers3d.loss` (the rule `layers3d.loss.build_cross_entropy` applies): its vocabulary is whole and its
    tokens are whole too, or it reduces nothing."""
    tokens = any(lay.dims[:-1])
    return not lay.dims[-1] and (not tokens or op.attrs.get("reduction", "mean") == "none")


# FLOPs per element: log-softmax plus the gather of the target.
@op_family("cross_entropy", ops=("cross_entropy", "cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss2d"),
           classify=cross_entropy_call, flops_per_elem=6, in_map=True)
def cross_entropy_rule(op: OpNode, mesh: Mesh, candidates: Candidates, device: str) -> Iterator[Offer | str]:
    logits, targets, out = op.input_meta[0], op.input_meta[1], op.out
    for lay in input_candidates_for(op, 0, candidates, mesh):
        vocab_axes = lay.dims[-1]
        if vocab_axes and lay.interleave > 1:
            yield f"cross-entropy over an interleaved vocab split {lay}"
            continue
        t_lay = Layout(lay.dims[:-1])
        if not t_lay.fits(targets.shape, mesh):
            yield f"targets {targets.shape} do not split like {lay}"
            continue
        tokens = t_lay.local_numel(targets.shape, mesh)
        u = Usage(mesh, dtype=logits.dtype)
        nll = op.attrs.get("fn") == "nll_loss"  # input already log-probabilities: only the target is summed
        for _ in VOCAB_STATS[1:2] if nll else VOCAB_STATS:
            u.collective("all_reduce", vocab_axes, _STAT_BYTES * tokens, "forward", "stats")
        if len(out.shape) == 0:
            o_lay = Layout(())
            u.collective("all_reduce", t_lay.axes(), _TOTAL_BYTES, "forward", "output")
        else:
            o_lay = t_lay
        logit_bytes = local_bytes(logits, lay, mesh)
        if nll:  # nll_loss saves its input, the log_softmax output that op saves too
            u.save(tensor_key(op.inputs[0], lay), logit_bytes)
        else:
            u.save(f"{op.name}:log_softmax:{lay}", logit_bytes)
        u.save(tensor_key(op.inputs[1], t_lay), local_bytes(targets, t_lay, mesh))
        # Working sets of layers3d.loss (fp32 math): forward holds the logits, z = logits - max and exp(z)
        # (plus the fp32 softmax before its cast when the logits are 16-bit; the cast copy is saved);
        # backward builds the fp32 gradient (from an fp32 copy of the saved softmax when 16-bit) and casts
        # it back. nll_loss (input already log-probabilities) only reads its input. A loss that runs as
        # traced (`runs_as_traced`: torch's log_softmax + nll_loss) keeps only its saved log-probabilities
        # in forward; its backward holds nll_loss's gradient and log_softmax's, both of the logits' size
        # and dtype (measured: 1,048,576 B for (256, 512) fp32 logits on a replicated HF BERT rank).
        f32 = 4 * lay.local_numel(logits.shape, mesh)
        if nll:
            u.temp(logit_bytes)
        elif runs_as_traced(op, lay):
            u.temp(2 * logit_bytes)
        else:
            half = logits.itemsize != 4
            u.temp(max(logit_bytes + 2 * f32 + (f32 if half else 0),
                       f32 + ((f32 + logit_bytes) if half else 0)))
        u.fwd_flops = flops_per_elem("cross_entropy") * lay.local_numel(logits.shape, mesh)
        u.bwd_flops = 2 * lay.local_numel(logits.shape, mesh)
        u.fwd_bytes, u.bwd_bytes = 2 * logit_bytes, 2 * logit_bytes
        yield Strategy("vocab" if vocab_axes else "follow", (lay, t_lay), (o_lay,)), u
