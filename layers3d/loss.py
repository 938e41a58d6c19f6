"""Cross-entropy over logits whose vocabulary dim may be split over mesh axes T (vocab-parallel).

Each rank holds logits (*tokens_local, V/T) for its vocabulary range. Forward all-reduces over T (tag
stats, fp32, one number per local token each): the max logit, the target logit (the rank owning the
target contributes it) and the sum of exp; then the number of non-ignored targets over the token axes
(one fp32 number), so that the mean is over all tokens. Backward is local: softmax - onehot, scaled.

Loss convention: each rank returns sum(its tokens' losses) / (global number of counted tokens), which is
replicated over T. The dense mean loss is the sum of the rank losses over the token axes, and gradients
reduced by sum over those axes (as every layer here does) are the dense gradients.
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
        picked = z.gather(-1, local_t[..., None]).squeeze(-1) * mine       # (*tok,)
        picked = all_reduce(picked, vocab, mesh, tag="stats")
        ez = z.exp()
        sumexp = all_reduce(ez.sum(-1), vocab, mesh, tag="stats")                # (*tok,)
        count = all_reduce(valid.sum().to(torch.float32).reshape(1), tokens, mesh, tag="stats")
        loss = ((sumexp.log() - picked) * valid).sum() / count[0]
        ctx.save_for_backward(ez / sumexp[..., None], local_t, mine, valid, count)  # softmax (*tok, V/T)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None, None]:
        softmax, local_t, mine, valid, count = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local_t[..., None], -mine[..., None].to(grad.dtype))
        grad = grad * (valid[..., None] * (g / count[0]))
        return grad.to(ctx.dtype), None, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, mesh: DeviceMesh, *,
                                 vocab_axes: Sequence[str] = (), token_axes: Sequence[str] = (),
                                 ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy of this rank's tokens (see the module docstring for the convention).

    logits: (*tokens_local, V / T) with the vocabulary split over `vocab_axes` (block order); target:
    (*tokens_local) class indices in [0, V) or ignore_index; token_axes: the axes splitting the tokens.
    """
    return _VocabParallelCE.apply(logits, target, tuple(vocab_axes), tuple(token_axes), mesh, ignore_index)
