"""Cross-entropy over logits whose vocabulary dim may be split over mesh axes T (vocab-parallel).

Each rank holds logits (*tokens_local, V/T) for its vocabulary range. Forward all-reduces over T (tag
stats, fp32, one number per local token each): the max logit, the target logit (the rank owning the
target contributes it) and the sum of exp. The mean over all tokens then needs the sum of the token
losses and the number of counted (not ignored) tokens over the axes splitting the tokens: one all-reduce
of those two fp32 numbers (tag output). Every rank returns the complete mean loss, equal to the dense
F.cross_entropy; its backward is local (softmax - onehot, over the global count), which is the complete
gradient of the local logits (the all-reduce's backward passes the gradient through).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from layers3d.builders import LayerRequest, builds
from layers3d.comm import all_reduce
from layers3d.errors import LayerBuildError
from layers3d.functional import reduce_output
from layers3d.mesh import DeviceMesh

__all__ = ["vocab_parallel_cross_entropy", "ParallelCrossEntropy", "SumCrossEntropy", "build_cross_entropy"]

Axes = tuple[str, ...]


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, vocab: Axes, tokens: Axes, mesh: DeviceMesh,
                ignore_index: int) -> torch.Tensor:
        z = logits.float()                                                    # (*tok, V/T)
        v_loc = z.shape[-1]
        lo = mesh.group_rank(vocab) * v_loc if vocab else 0
        zmax = all_reduce(z.max(-1).values, vocab, mesh, tag="stats", op="max")   # (*tok,)
        z = z - zmax[..., None]
        valid = target != ignore_index
        mine = valid & (target >= lo) & (target < lo + v_loc)
        local_t = torch.where(mine, target - lo, torch.zeros_like(target))
        picked = all_reduce(z.gather(-1, local_t[..., None]).squeeze(-1) * mine, vocab, mesh, tag="stats")
        ez = z.exp()
        sumexp = all_reduce(ez.sum(-1), vocab, mesh, tag="stats")                # (*tok,)
        local = torch.stack([((sumexp.log() - picked) * valid).sum(), valid.sum().to(torch.float32)])
        total = all_reduce(local, tokens, mesh, tag="output")                    # (2,): loss sum, count
        # Saved: the softmax in the logits' dtype and the targets; the masks are recomputed in backward.
        ctx.save_for_backward((ez / sumexp[..., None]).to(logits.dtype), target)       # (*tok, V/T), (*tok,)
        ctx.lo, ctx.ignore_index, ctx.count = lo, ignore_index, total[1]  # a 0-dim tensor: no device sync
        return total[0] / total[1]

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None, None]:
        softmax, target = ctx.saved_tensors
        grad = softmax.float()
        valid = target != ctx.ignore_index
        mine = valid & (target >= ctx.lo) & (target < ctx.lo + grad.shape[-1])
        local_t = torch.where(mine, target - ctx.lo, torch.zeros_like(target))
        grad.scatter_add_(-1, local_t[..., None], -mine[..., None].to(grad.dtype))
        grad = grad * (valid[..., None] * (g.float() / ctx.count))
        return grad.to(softmax.dtype), None, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, mesh: DeviceMesh, *,
                                 vocab_axes: Sequence[str] = (), token_axes: Sequence[str] = (),
                                 ignore_index: int = -100) -> torch.Tensor:
    """The mean cross-entropy over all tokens (as F.cross_entropy), on every rank.

    logits: (*tokens_local, V / T) with the vocabulary split over `vocab_axes` (block order); target:
    (*tokens_local) class indices in [0, V) or ignore_index; token_axes: the axes splitting the tokens.
    Axes in neither hold replicas.
    """
    return _VocabParallelCE.apply(logits, target, tuple(vocab_axes), tuple(token_axes), mesh, ignore_index)


class ParallelCrossEntropy(nn.Module):
    """Mean cross-entropy of logits whose tokens and vocabulary may be split: the vocab-parallel loss,
    which all-reduces the loss sum and the token count over the token axes, so every rank holds the
    dense model's loss."""

    def __init__(self, mesh: DeviceMesh, vocab_axes: Axes, token_axes: Axes, ignore_index: int) -> None:
        super().__init__()
        self.mesh, self.vocab_axes, self.token_axes, self.ignore_index = mesh, vocab_axes, token_axes, ignore_index

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = vocab_parallel_cross_entropy(logits, target, self.mesh, vocab_axes=self.vocab_axes,
                                            token_axes=self.token_axes, ignore_index=self.ignore_index)
        return loss.to(logits.dtype)

    def extra_repr(self) -> str:
        return f"vocab={self.vocab_axes}, tokens={self.token_axes}, ignore_index={self.ignore_index}"


class SumCrossEntropy(nn.Module):
    """Summed cross-entropy over token-split logits (vocabulary whole): local sum, then all-reduced."""

    def __init__(self, mesh: DeviceMesh, token_axes: Axes, ignore_index: int) -> None:
        super().__init__()
        self.mesh, self.token_axes, self.ignore_index = mesh, token_axes, ignore_index

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(logits, target, ignore_index=self.ignore_index, reduction="sum")
        return reduce_output(loss, self.token_axes, self.mesh)


@builds("cross_entropy")
def build_cross_entropy(req: LayerRequest) -> nn.Module | None:
    """The loss of logits in their planned layout: None (run as traced) when it is local."""
    op, lay = req.op, (req.inputs[0] if req.inputs else None)
    reduction = op.attrs.get("reduction", "mean")
    vocab = tuple(lay.dims[-1]) if lay is not None else ()
    tokens = tuple(ax for d in lay.dims[:-1] for ax in d) if lay is not None else ()
    if op.attrs.get("fn", "cross_entropy") != "cross_entropy":
        if vocab or (tokens and reduction != "none"):
            raise LayerBuildError(f"{op.name}: a split nll_loss is not supported; plan it replicated")
        return None
    if not vocab and (not tokens or reduction == "none"):
        return None  # local: run as traced
    if reduction == "mean":
        return ParallelCrossEntropy(req.mesh, vocab, tokens, int(op.attrs.get("ignore_index", -100)))
    if reduction == "sum" and not vocab:
        return SumCrossEntropy(req.mesh, tokens, int(op.attrs.get("ignore_index", -100)))
    raise LayerBuildError(f"{op.name}: cross-entropy with reduction={reduction!r} over a split vocabulary is not "
                          "supported; use reduction='mean'")
