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

from layers3d.comm import all_reduce
from layers3d.mesh import DeviceMesh

__all__ = ["vocab_parallel_cross_entropy"]

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
