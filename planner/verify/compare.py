"""Per-tensor comparison of a parallel run against the dense one, that a wrong tensor cannot hide from.

Each tensor is compared on its own scale: error = max |got - want| / max(max |want|, floor). The floor is
absolute and shared by every tensor of one comparison; it is what a tensor's scale counts as "zero":

* gradients: `GRAD_NOISE` x the global L2 norm of the dense gradients. A parameter whose gradient is zero
  in exact arithmetic (the attention key bias: softmax ignores a per-query constant) holds rounding noise,
  about 1e-12 of a BERT's global norm of 1; two summation orders give two different noises, so on its own
  scale it would always "fail". Against the floor it passes, and it never heads the failing list.
* parameters after AdamW steps: each tensor on its own scale (max |dense value|), with the floor
  `STEP_FLOOR` x the largest distance any element moved in the steps (`move_floor`). The own scale is the
  value's, not the move's: fp32 stores a weight of 0.05 to 4e-9, more than the update of a small-gradient
  element. The floor is a move, about the learning rate under AdamW, never the largest value of the
  state dict (a LayerNorm weight of 1, 10^4 times the update, which hid whole wrong bias tensors); it is
  100 moves because AdamW divides every gradient element by its own size, so an element whose gradient
  is cancellation noise (a sum of terms 10^3 times larger) moves differently in two summation orders, by
  up to 1.5e-5 of a step measured on hf-bert under fsdp. At tol 1e-5 the check then resolves 1e-3 of a
  step; a tensor updated wrongly (a whole step off, a shard not updated) fails by 10^3 of the tolerance.

`compare` returns one `Comparison`: the largest error, and every tensor above the tolerance, worst first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

__all__ = ["GRAD_NOISE", "STEP_FLOOR", "TensorError", "Comparison", "compare", "grad_floor", "moved", "move_floor"]

GRAD_NOISE = 1e-5
"""Fraction of the global gradient norm below which a gradient's own scale counts as rounding noise."""

STEP_FLOOR = 100.0
"""Parameters after AdamW steps: the floor in units of the largest distance a parameter moved."""


@dataclass(frozen=True)
class TensorError:
    """One tensor's comparison: its error (diff / max(scale, floor)), the largest absolute difference and
    its own scale (max |want|)."""

    name: str
    error: float
    diff: float
    scale: float


@dataclass
class Comparison:
    """All tensors of one quantity compared: `rows` worst first, `floor` the shared absolute floor."""

    rows: list[TensorError] = field(default_factory=list)
    floor: float = 0.0

    @property
    def worst(self) -> TensorError | None:
        return self.rows[0] if self.rows else None

    @property
    def error(self) -> float:
        return self.rows[0].error if self.rows else 0.0

    def failing(self, tol: float) -> list[TensorError]:
        """Every tensor whose error exceeds `tol`, worst first."""
        return [r for r in self.rows if r.error > tol]


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64)


def _absmax(t: torch.Tensor) -> float:
    return t.abs().max().item() if t.numel() else 0.0


def compare(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor], floor: float = 0.0) -> Comparison:
    """Every tensor of `want` against the one of the same name in `got` (a missing tensor or a shape
    mismatch is an infinite error); see the module docstring."""
    rows = []
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            rows.append(TensorError(name, float("inf"), float("inf"), _absmax(_f64(w))))
            continue
        a, b = _f64(g), _f64(w)
        diff, scale = _absmax(a - b), _absmax(b)
        denom = max(scale, floor)
        rows.append(TensorError(name, diff / denom if denom > 0 else diff, diff, scale))
    rows.sort(key=lambda r: (-r.error, r.name))
    return Comparison(rows, floor)


def grad_floor(grads: Mapping[str, torch.Tensor], noise: float = GRAD_NOISE) -> float:
    """`noise` x the global L2 norm of `grads` (the dense gradients)."""
    total = sum((_f64(g) ** 2).sum().item() for g in grads.values())
    return noise * total ** 0.5


def moved(after: Mapping[str, torch.Tensor], before: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """after - before per tensor (float64), for the names both hold with the same shape."""
    return {k: _f64(v) - _f64(before[k]) for k, v in after.items() if k in before and before[k].shape == v.shape}


def move_floor(moves: Mapping[str, torch.Tensor], factor: float = 1.0) -> float:
    """`factor` x the largest distance any element moved (verify uses `STEP_FLOOR`)."""
    return factor * max((_absmax(m) for m in moves.values()), default=0.0)
