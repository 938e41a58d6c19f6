"""The scheme names: one enum, read by the cost model, the runtime, the CLI, the baselines and the plots.

`Scheme` lists every name a strategy may carry. The heavy ones are the user-facing tensor-parallel
schemes (docs/ARCHITECTURE.md); "1d" on the command line and in `plan(schemes=...)` names the pair
`1d_col` + `1d_row`. `UNIFORM_GROUPS` are the "one scheme throughout" baselines the planner compares its
mixed plan with.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Scheme", "HEAVY_SCHEMES", "SCHEMES", "UNIFORM_GROUPS", "BASELINE_SCHEMES", "USER_SCHEMES"]


class Scheme(str, Enum):
    """A scheme name (a `str`, so it compares equal to and serialises as its value)."""

    REPLICATE = "replicate"
    FSDP = "fsdp"
    ONE_D_COL = "1d_col"
    ONE_D_ROW = "1d_row"
    TWO_D = "2d"
    THREE_D = "3d"
    THREE_D_ALLREDUCE = "3d_allreduce"
    # not user-facing: an element-wise/shape op that keeps its input's layout; vocabulary-parallel
    # embedding / head / cross-entropy; sequence-split layer norm / dropout
    FOLLOW = "follow"
    VOCAB = "vocab"
    SEQ = "seq"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def heavy(cls) -> tuple[Scheme, ...]:
        """The tensor-parallel schemes of the heavy ops (linear, embedding, attention, norms)."""
        return tuple(s for s in cls if s not in (cls.FOLLOW, cls.VOCAB, cls.SEQ))


HEAVY_SCHEMES: tuple[str, ...] = tuple(s.value for s in Scheme.heavy())
SCHEMES: tuple[str, ...] = tuple(s.value for s in Scheme)
# "One scheme throughout" baselines: the 1d pair counts as one.
UNIFORM_GROUPS: tuple[tuple[str, ...], ...] = tuple(
    (Scheme.ONE_D_COL.value, Scheme.ONE_D_ROW.value) if s == Scheme.ONE_D_COL else (s.value,)
    for s in Scheme.heavy() if s != Scheme.ONE_D_ROW)
# Their user-facing names (CLI --schemes / --baselines, plan(schemes=...)).
BASELINE_SCHEMES: tuple[str, ...] = tuple("1d" if len(g) > 1 else g[0] for g in UNIFORM_GROUPS)
# Every name `plan(schemes=...)` and `--schemes` accept: the baselines and the two 1d halves.
USER_SCHEMES: tuple[str, ...] = BASELINE_SCHEMES + (Scheme.ONE_D_COL.value, Scheme.ONE_D_ROW.value)

