"""Redistribution cost on a graph edge: converting a producer's output layout to its consumer's.

Built on `plan_redistribution` (forward steps) and `backward_steps` (the gradient's steps, under the
complete-gradient convention), so the priced collectives are exactly those the runtime runs. Every
collective is tagged "edge". Same layout: no steps, zero cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from cost_models.comm import collective_seconds
from cost_models.hardware import HardwareProfile
from cost_models.layout import Layout, caller_layout
from cost_models.memory import conversion_pair_working_set
from cost_models.mesh import Mesh
from cost_models.ops import FLOAT_DTYPES, OpNode, TensorMeta
from cost_models.redistribution import Step, backward_steps, plan_redistribution
from cost_models.strategy import Collective

__all__ = ["EdgeCost", "carries_gradient", "edge_cost", "grad_flow", "output_working_set"]


@dataclass(frozen=True)
class EdgeCost:
    """Cost of one layout conversion, per rank per training step.

    forward / backward: the redistribution steps of the tensor and of its gradient.
    collectives: their collectives (tag "edge", phase "forward" / "backward").
    seconds: alpha-beta time of all of them; fwd_seconds: of the forward ones (paid again when the
        consumer's block is checkpointed).
    transient_bytes: the largest local buffer the conversion touches (before or after any step, either
        direction): an upper bound on the temporary memory it needs.
    """

    forward: tuple[Step, ...]
    backward: tuple[Step, ...]
    collectives: tuple[Collective, ...]
    seconds: float
    fwd_seconds: float
    transient_bytes: int

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.collectives)


def _collectives(steps: list[Step], phase: str, mesh: Mesh) -> list[Collective]:
    return [Collective(s.kind, s.axes, s.bytes, phase, "edge") for s in steps
            if s.is_collective and mesh.size(s.axes) > 1]


@cache
def edge_cost(meta: TensorMeta, src: Layout, dst: Layout, mesh: Mesh, hw: HardwareProfile,
              grad: bool = True) -> EdgeCost:
    """Cost of converting a tensor of `meta` from layout `src` to `dst` on `mesh` (forward and backward).
    `grad=False` for a tensor no gradient flows back through (see `grad_flow`): forward steps only.
    Raises LayoutError when a layout does not fit the tensor or `dst` asks for a partial sum `src`
    does not have."""
    fwd = plan_redistribution(meta.shape, meta.itemsize, src, dst, mesh)
    bwd = backward_steps(fwd, meta.shape, meta.itemsize, mesh) if grad and carries_gradient(meta) else []
    colls = _collectives(fwd, "forward", mesh) + _collectives(bwd, "backward", mesh)
    fwd_s = sum(collective_seconds(c, mesh, hw) for c in colls if c.phase == "forward")
    total = fwd_s + sum(collective_seconds(c, mesh, hw) for c in colls if c.phase == "backward")
    biggest = 0
    for s in fwd + bwd:
        for lay in (s.before, s.after):
            biggest = max(biggest, lay.local_numel(meta.shape, mesh) * meta.itemsize)
    return EdgeCost(tuple(fwd), tuple(bwd), tuple(colls), total, fwd_s, biggest)


def grad_flow(nodes: Iterable[OpNode]) -> dict[str, bool]:
    """Which ops' outputs carry a gradient in backward: those computed from a parameter (the op has
    parameters or reads an output that carries one). Graph inputs, buffers, and what is computed from
    them alone (position ids, attention masks, even in floating point) carry none, so a conversion of
    such a tensor has no backward steps. `nodes` in execution order."""
    flows: dict[str, bool] = {}
    for op in nodes:
        flows[op.name] = bool(op.params) or any(flows.get(src, False) for src in op.inputs)
    return flows


def carries_gradient(meta: TensorMeta) -> bool:
    """Whether a tensor of this dtype can carry a gradient back: floating point and complex (rotary
    embeddings' complex views); integer and boolean tensors (token ids, masks) carry none."""
    return meta.dtype in FLOAT_DTYPES or meta.dtype == "complex64"


def output_working_set(outputs: Sequence[TensorMeta], k: int, have: Layout, input_mode: str, mesh: Mesh,
                       hw: HardwareProfile, grad: bool = True) -> int:
    """Bytes alive while the graph's output `k` is converted from `have` to the caller's layout
    (`caller_layout`: whole on every rank with input_mode "full", this rank's batch block with "sharded"):
    the conversion's working set (forward, or its gradient's backward), plus the caller-layout bytes of
    outputs 0..k-1, which the caller holds by then (counted whether or not they needed converting: an
    upper bound by at most those bytes). The outputs exist at the end of the forward, beside every saved
    activation; their collectives are the caller's (tag io), not a plan step's. One definition for the
    solver (an edge into the output node) and the plan's accounting."""
    meta = outputs[k]
    want = caller_layout(meta.shape, input_mode, mesh)
    if have == want:
        return 0
    held = sum(caller_layout(m.shape, input_mode, mesh).local_numel(m.shape, mesh) * m.itemsize
               for m in outputs[:k])
    ec = edge_cost(meta, have, want, mesh, hw, grad=grad)
    return held + conversion_pair_working_set(ec.forward, ec.backward, meta.shape, meta.itemsize, mesh)
