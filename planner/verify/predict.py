"""The collectives a plan predicts for one training step, per rank, from the cost model.

The plan JSON keeps per-op totals; `verify` needs them per collective kind and phase to set against what
`layers3d.CommCounter` measures. They are recomputed here from the plan's own assignments with the cost
model (`op_cost` of each op's strategy, `edge_cost` of each layout conversion): the same functions that
priced the plan. A checkpointed block's forward collectives, and those of the conversions into and inside
it, run again in backward (phase "recompute").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from cost_models.edges import edge_cost, grad_flow
from cost_models.hardware import HardwareProfile
from cost_models.mesh import Mesh
from cost_models.ops import OpNode
from cost_models.strategies import enumerate_strategies, mark_graph_hints, op_cost
from cost_models.strategy import Collective, Strategy
from planner.plans.format import Assignment, Plan, PlanError
from planner.trace.graph import ModelGraph

__all__ = ["PredictedComm", "predicted_collectives", "by_kind", "by_kind_equal"]


@dataclass
class PredictedComm:
    """Predicted collectives of one step, and the plan's own total for cross-checking."""

    collectives: list[Collective]
    plan_total_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.collectives)


def _out_index(producer_outputs: int, consumer_kind: str, consumer_attrs: dict) -> int:
    if producer_outputs > 1 and consumer_kind == "getitem":
        return int(consumer_attrs["index"])
    return 0


def _strategy(op: OpNode, a: Assignment, mesh: Mesh) -> Strategy:
    """The cost model's Strategy value of an assignment. Matched among the op's strategies rather than
    rebuilt: the plan JSON stores parameters as an object with sorted keys, which loses the order the
    Strategy value (a tuple) has."""
    want = a.to_strategy()
    cands = [[lay] if lay is not None else [] for lay in a.inputs]
    found, _ = enumerate_strategies(op, mesh, cands)
    for s in found:
        if (s.scheme, s.inputs, s.outputs, s.options) == (want.scheme, want.inputs, want.outputs, want.options) \
                and dict(s.params) == a.params:
            return s
    raise PlanError(f"the cost model offers no strategy {want} for op {op.name} any more; re-run `planner plan`")


def predicted_collectives(graph: ModelGraph, plan: Plan) -> PredictedComm:
    """Every collective the plan's strategies and conversions run in one step (see the module docstring).
    `graph` is the model captured again (the fingerprint must match the plan's)."""
    mark_graph_hints(graph.nodes)
    hw = HardwareProfile.from_json(plan.hardware)
    mesh = plan.mesh
    asg = {a.node: a for a in plan.assignments}
    ckpt = set(plan.checkpoint)
    out: list[Collective] = []
    flows = grad_flow(graph.nodes)
    for op in graph.nodes:
        a = asg[op.name]
        again = op.block in ckpt
        cost = op_cost(op, _strategy(op, a, mesh), mesh, hw, device=plan.options.device,
                       bytes_per_param=plan.options.bytes_per_param)
        for c in cost.collectives:
            out.append(c)
            if again and c.phase == "forward":
                out.append(Collective(c.kind, c.axes, c.bytes, "recompute", c.tag))
        for arg, src in enumerate(op.inputs):
            need = a.inputs[arg] if arg < len(a.inputs) else None
            prod = graph.node(src)
            have = asg[src].outputs[_out_index(len(prod.outputs), op.kind, op.attrs)]
            if need is None or need == have:
                continue
            ec = edge_cost(op.input_meta[arg], have, need, mesh, hw, grad=flows[src])
            for c in ec.collectives:
                out.append(c)
                if again and c.phase == "forward":
                    out.append(Collective(c.kind, c.axes, c.bytes, "recompute", c.tag))
    return PredictedComm(out, plan.predicted.comm_bytes)


def by_kind(collectives: list[Collective]) -> Counter:
    """Bytes per (kind, phase)."""
    total: Counter = Counter()
    for c in collectives:
        total[(c.kind, c.phase)] += c.bytes
    return total


def by_kind_equal(a: dict, b: dict) -> bool:
    """Whether two bytes-per-(kind, phase) tables agree (zero entries count as absent)."""
    return {k: v for k, v in a.items() if v} == {k: v for k, v in b.items() if v}
