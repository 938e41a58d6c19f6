"""Token dims of activations at run time: which mesh axes split the batch and sequence dims.

The same rule as the cost model's (`cost_models.layout.split_tokens`): token axes fill the batch dim first,
then the sequence dim; sequence-parallel axes go on the last token dim.
"""

from __future__ import annotations

from collections.abc import Sequence

from cost_models.layout import Axes, split_tokens
from cost_models.mesh import Mesh
from layers3d.errors import ShardingError

__all__ = ["token_dims", "default_token_shape"]


def default_token_shape(local: Sequence[int], token_axes: Axes, seq_axes: Axes, mesh: Mesh) -> tuple[int, ...]:
    """Global token dims when only the local ones are known: every token axis on the batch dim, the
    sequence-parallel axes on the last token dim (what split_tokens gives when the batch divides)."""
    out = list(local)
    out[0] *= mesh.size(token_axes)
    out[-1] *= mesh.size(seq_axes)
    return tuple(out)


def token_dims(tok_shape: Sequence[int], token_axes: Axes, seq_axes: Axes, mesh: Mesh, what: str) -> tuple[Axes, ...]:
    """Per token dim, the axes splitting it: `split_tokens` over token_axes, then seq_axes appended to the
    last token dim (sequence parallelism)."""
    dims = split_tokens(tuple(tok_shape), len(tok_shape), token_axes, mesh)
    if dims is None:
        raise ShardingError(
            f"{what}: token dims {tuple(tok_shape)} cannot be split over mesh axes {token_axes} "
            f"({mesh.size(token_axes)} ways, batch first); make the batch size (times sequence) divisible by it"
        )
    return dims[:-1] + (dims[-1] + seq_axes,)
