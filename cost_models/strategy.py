"""Strategies and their costs: plain values that enumerating, costing and solving pass along.

A `Strategy` is one way to run one op on the mesh: the layout each tensor input must arrive in, the
layout of each output, the storage layout of each parameter, and scheme options. An `OpCost` is what that
strategy costs one rank: model-state elements, saved-activation and transient bytes, FLOPs, compute
seconds and the collectives the op runs internally. Conversions *between* ops are priced separately
(`cost_models.redistribution`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from cost_models.layout import Axes, Layout
from cost_models.schemes import HEAVY_SCHEMES, SCHEMES

__all__ = ["SCHEMES", "HEAVY_SCHEMES", "COLLECTIVE_KINDS", "COLLECTIVE_TAGS", "PHASES", "CollectiveKind", "CollectiveTag",
           "Phase", "Collective", "Strategy",
           "OpCost", "SavedTensor"]

# The collectives the cost model prices and layers3d runs (and counts), and the phases of a training step
# they run in: one closed vocabulary each, checked when a Collective is made.
CollectiveKind = Literal["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast"]
COLLECTIVE_KINDS: tuple[str, ...] = get_args(CollectiveKind)
Phase = Literal["forward", "backward", "recompute"]
PHASES: tuple[str, ...] = get_args(Phase)
# What a collective moves: an op's input, weight, output or their gradients, a norm's or a loss's
# statistics, an edge's layout conversion, the caller's inputs and outputs (io), a tied weight's copy, a
# stored parameter's state (gathering a state dict); "" when untold.
CollectiveTag = Literal["", "input", "weight", "output", "grad_input", "grad_weight", "grad_bias", "grad_output",
                        "stats", "edge", "io", "tied", "state"]
COLLECTIVE_TAGS: tuple[str, ...] = get_args(CollectiveTag)

# The scheme names (one enum, cost_models.schemes), re-exported where strategies are defined.


@dataclass(frozen=True)
class Collective:
    """One collective one rank takes part in.

    kind: "all_gather" | "reduce_scatter" | "all_reduce" | "all_to_all" | "broadcast".
    axes: the mesh axes of its group.
    bytes: per-rank size of the full buffer (gathered output / unreduced input / local tensor).
    phase: "forward", "backward", or "recompute" (a checkpointed block's forward collectives run again).
    tag: what moves (COLLECTIVE_TAGS), for people and for matching with measurements.
    """

    kind: CollectiveKind
    axes: Axes
    bytes: int
    phase: Phase
    tag: CollectiveTag = ""

    def __post_init__(self) -> None:
        if self.kind not in COLLECTIVE_KINDS:
            raise ValueError(f"collective kind {self.kind!r} is not one of {', '.join(COLLECTIVE_KINDS)}")
        if self.phase not in PHASES:
            raise ValueError(f"collective phase {self.phase!r} is not one of {', '.join(PHASES)}")
        if self.tag not in COLLECTIVE_TAGS:
            raise ValueError(f"collective tag {self.tag!r} is not one of {', '.join(map(repr, COLLECTIVE_TAGS))}")

    def __str__(self) -> str:
        return f"{self.phase[:3]} {self.kind}({''.join(self.axes)}) {self.bytes}B {self.tag}".rstrip()


@dataclass(frozen=True)
class Strategy:
    """One way to run an op. `options` holds scheme details as sorted (key, value) pairs, e.g.
    (("roles", ("z", "x", "y")), ("save_input", "shard")) for a 3D linear."""

    scheme: str
    inputs: tuple[Layout | None, ...]
    outputs: tuple[Layout, ...]
    params: tuple[tuple[str, Layout], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()

    def option(self, key: str, default: Any = None) -> Any:
        for k, v in self.options:
            if k == key:
                return v
        return default

    @property
    def output(self) -> Layout:
        return self.outputs[0]

    def label(self) -> str:
        opts = ",".join(f"{k}={''.join(v) if isinstance(v, tuple) else v}" for k, v in self.options)
        return self.scheme + (f"[{opts}]" if opts else "")

    def __str__(self) -> str:
        ins = ", ".join(str(x) if x is not None else "_" for x in self.inputs)
        outs = ", ".join(str(x) for x in self.outputs)
        return f"{self.label()} ({ins}) -> {outs}"


@dataclass(frozen=True)
class SavedTensor:
    """A tensor autograd keeps for backward: `key` identifies it (so two ops saving the same tensor count
    it once), `bytes` is its local size."""

    key: str
    bytes: int


@dataclass
class OpCost:
    """What one strategy of one op costs one rank in one training step (forward + backward).

    param_elems: parameter elements this rank stores (model-state bytes = param_elems * bytes_per_param).
    largest_param_elems: the elements of the largest of those parameters (`cost_models.optimizer`).
    buffer_bytes: buffer bytes this rank stores (not trained: no gradient, no optimizer state).
    state_bytes: param_elems * bytes_per_param + buffer_bytes, as priced by `cost_models.strategies.op_cost`.
    saved: tensors autograd keeps for backward (local sizes).
    transient_bytes: the largest temporary buffer alive while the op runs (gathered weights/inputs,
        unreduced outputs, gradient buffers).
    fwd_extra_bytes: what the forward alone holds beyond the op's output and its saved tensors (the
        working set of its re-run when its block is checkpointed).
    flops: local forward + backward FLOPs; fwd_flops: the forward part (re-run when checkpointed).
    compute_s / fwd_compute_s: roofline seconds for flops / fwd_flops.
    collectives: the op's internal collectives, forward and backward.
    comm_s / fwd_comm_s: alpha-beta seconds of all collectives / of the forward ones.
    """

    param_elems: int = 0
    state_bytes: int = 0
    buffer_bytes: int = 0
    saved: tuple[SavedTensor, ...] = ()
    largest_param_elems: int = 0
    transient_bytes: int = 0
    fwd_extra_bytes: int = 0
    flops: float = 0.0
    fwd_flops: float = 0.0
    compute_s: float = 0.0
    fwd_compute_s: float = 0.0
    collectives: tuple[Collective, ...] = ()
    comm_s: float = 0.0
    fwd_comm_s: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def saved_bytes(self) -> int:
        return sum(s.bytes for s in self.saved)

    @property
    def time_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def recompute_s(self) -> float:
        """Extra seconds when the op's block is checkpointed: its forward runs again in backward."""
        return self.fwd_compute_s + self.fwd_comm_s

    @property
    def comm_bytes(self) -> int:
        return sum(c.bytes for c in self.collectives)
