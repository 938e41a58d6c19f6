"""From a solved problem back to a `Plan`: per-op assignments, redistributions and the prediction.

The numbers follow the accounting contract in `planner.plan_format` (what `planner explain` adds up), and
are recomputed here op by op from the cost model rather than read from the solver, so a plan's
prediction is exact for its own assignment (saved tensors shared by several ops count once).
"""

from __future__ import annotations

from cost_models.edges import edge_cost, grad_flow
from cost_models.hardware import HardwareProfile
from cost_models.memory import conversion_pair_working_set
from planner.build import BuiltProblem, _out_layout
from planner.graph import ModelGraph
from planner.plan_format import (
    Assignment,
    AssignmentCost,
    InputInfo,
    ModelInfo,
    OpPrediction,
    Plan,
    PlanOptions,
    Predicted,
    Redistribution,
    SolverInfo,
)
from planner.solve import Solution

__all__ = ["assemble_plan"]


def _forward_bytes(cost) -> int:
    """Bytes of an op's forward collectives: they run again when its block is checkpointed."""
    return sum(c.bytes for c in cost.collectives if c.phase == "forward")


def _json_value(v):
    return [_json_value(x) for x in v] if isinstance(v, tuple | list) else v


def _identity_aliases(graph: ModelGraph) -> dict[str, str]:
    """Ops whose output is their input tensor itself (dropout with p = 0 or not training returns its
    input): op name -> the op that produced that tensor, so that saved-tensor keys naming either count once
    (the softmax output saved by softmax and by the attention matmul behind a p = 0 dropout)."""
    alias: dict[str, str] = {}
    for op in graph.nodes:
        if op.kind == "dropout" and op.inputs and (float(op.attrs.get("p", 0.5)) == 0.0
                                                   or not op.attrs.get("training", True)):
            alias[op.name] = alias.get(op.inputs[0], op.inputs[0])
    return alias


def _canonical_key(key: str, alias: dict[str, str]) -> str:
    head, sep, rest = key.partition(":")
    return alias.get(head, head) + sep + rest


def assemble_plan(graph: ModelGraph, built: BuiltProblem, sol: Solution, hw: HardwareProfile, *, budget_bytes: int,
                  device: str, bytes_per_param: int, checkpointing: bool, schemes: list[str] | None,
                  seconds: dict[str, float] | None = None) -> Plan:
    mesh = built.mesh
    nodes = {n.name: n for n in graph.nodes}
    pick = built.strategy_of(sol.choice)
    ckpt = set(sol.checkpointed)
    in_ckpt = {n.name: (n.block in ckpt) for n in graph.nodes}

    # Redistributions on every edge whose layouts differ.
    redists: list[Redistribution] = []
    into: dict[str, tuple[float, float, int, int]] = {}  # node -> (seconds, forward seconds, bytes, forward bytes)
    # node -> the largest working set of a conversion into it (forward or backward): a transient the
    # solver's per-op choices do not see (it depends on the producer's choice too), priced here.
    edge_ws: dict[str, int] = {}
    flows = grad_flow(graph.nodes)
    for op in graph.nodes:
        strat = built.strategies[op.name][pick[op.name]]
        for arg, src in enumerate(op.inputs):
            lu = _out_layout(built.strategies[src][pick[src]], nodes[src], op)
            lv = strat.inputs[arg]
            if lv is None or lu == lv:
                continue
            meta = op.input_meta[arg]
            ec = edge_cost(meta, lu, lv, mesh, hw, grad=flows[src])
            labels = [f"fwd {st}" for st in ec.forward if st.is_collective] + \
                [f"bwd {st}" for st in ec.backward if st.is_collective]
            nbytes = ec.bytes
            secs = ec.seconds
            redists.append(Redistribution(src, op.name, list(meta.shape), lu, lv, labels, nbytes, secs))
            s0, f0, b0, fb0 = into.get(op.name, (0.0, 0.0, 0, 0))
            fwd_bytes = sum(c.bytes for c in ec.collectives if c.phase == "forward")
            into[op.name] = (s0 + secs, f0 + ec.fwd_seconds, b0 + nbytes, fb0 + fwd_bytes)
            edge_ws[op.name] = max(edge_ws.get(op.name, 0), conversion_pair_working_set(
                ec.forward, ec.backward, meta.shape, meta.itemsize, mesh))

    # Recomputed activations of a checkpointed block alive while one of its ops is differentiated: those
    # of the ops up to and including it (in forward order; the later ones are freed by then).
    block_saved: dict[str, int] = {}
    recomputed_upto: dict[str, int] = {}
    seen_keys: set[str] = set()
    op_saved: dict[str, int] = {}
    alias = _identity_aliases(graph)
    for op in graph.nodes:
        cost = built.costs[op.name][pick[op.name]]
        fresh = 0
        for t in cost.saved:
            key = _canonical_key(t.key, alias)
            if key not in seen_keys:
                seen_keys.add(key)
                fresh += t.bytes
        op_saved[op.name] = fresh
        if in_ckpt[op.name]:
            block_saved[op.block] = block_saved.get(op.block, 0) + fresh
            recomputed_upto[op.name] = block_saved[op.block]

    # A checkpointed block keeps its input: charge it to the first op in the block that reads it.
    kept: dict[str, int] = {}
    for b in graph.blocks:
        if b.name not in ckpt:
            continue
        inside = set(b.nodes)
        for n in b.nodes:
            outside = [s for s in nodes[n].inputs if s not in inside]
            if outside:
                src = outside[0]
                lay = _out_layout(built.strategies[src][pick[src]], nodes[src], nodes[n])
                meta = nodes[src].out
                kept[n] = lay.local_numel(meta.shape, mesh) * meta.itemsize
                break

    assignments: list[Assignment] = []
    per_op: list[OpPrediction] = []
    for op in graph.nodes:
        strat = built.strategies[op.name][pick[op.name]]
        cost = built.costs[op.name][pick[op.name]]
        r_secs, r_fwd, r_bytes, r_fwd_bytes = into.get(op.name, (0.0, 0.0, 0, 0))
        ck = in_ckpt[op.name]
        saved = kept.get(op.name, 0) if ck else op_saved[op.name]
        # In a checkpointed block's backward, recomputed activations are alive together with the working
        # set of the op (or the conversion into it) being differentiated.
        transient = max(cost.transient_bytes, edge_ws.get(op.name, 0)) + (recomputed_upto.get(op.name, 0) if ck else 0)
        recompute = (cost.recompute_s + r_fwd) if ck else 0.0
        ac = AssignmentCost(state_bytes=cost.param_elems * bytes_per_param, saved_bytes=saved,
                            transient_bytes=transient, compute_s=cost.compute_s, comm_s=cost.comm_s,
                            # A checkpointed op re-runs its forward collectives and those of the conversions into
                            # it (as recompute_s counts their seconds).
                            comm_bytes=cost.comm_bytes + (_forward_bytes(cost) + r_fwd_bytes if ck else 0),
                            recompute_s=recompute)
        assignments.append(Assignment(
            node=op.name, target=op.target, kind=op.kind, scheme=strat.scheme, strategy=strat.label(),
            inputs=list(strat.inputs), outputs=list(strat.outputs), params=dict(strat.params),
            options={k: _json_value(v) for k, v in strat.options}, block=op.block, module_path=op.module_path,
            cost=ac, not_offered=list(built.not_offered.get(op.name, [])),
        ))
        per_op.append(OpPrediction(op.name, strat.scheme, ac.compute_s + ac.comm_s + ac.recompute_s + r_secs,
                                   ac.comm_bytes + r_bytes, ac.state_bytes, ac.saved_bytes))

    states = sum(a.cost.state_bytes for a in assignments)
    acts = sum(a.cost.saved_bytes for a in assignments)
    trans = max((a.cost.transient_bytes for a in assignments), default=0)
    compute = sum(a.cost.compute_s for a in assignments)
    comm = sum(a.cost.comm_s for a in assignments) + sum(r.seconds for r in redists)
    recompute = sum(a.cost.recompute_s for a in assignments)
    predicted = Predicted(
        peak_memory_bytes=states + acts + trans, model_state_bytes=states, activation_bytes=acts,
        transient_bytes=trans, step_time_s=compute + comm + recompute, compute_s=compute, comm_s=comm,
        comm_bytes=sum(a.cost.comm_bytes for a in assignments) + sum(r.comm_bytes for r in redists),
        recompute_s=recompute, per_op=per_op,
    )
    solver = SolverInfo(sol.solver, sol.status, sol.objective, sol.gap, sol.seconds, getattr(sol, "method", ""))
    inputs = [InputInfo(n.name, list(n.out.shape), n.out.dtype) for n in graph.nodes if n.kind == "input"]
    return Plan(model=ModelInfo(graph.name, graph.fingerprint, inputs), mesh=mesh, budget_bytes=budget_bytes,
                hardware=hw.to_json(), assignments=assignments, redistributions=redists,
                checkpoint=sorted(ckpt, key=lambda b: [x.name for x in graph.blocks].index(b)),
                predicted=predicted, solver=solver, feasible=predicted.peak_memory_bytes <= budget_bytes,
                options=PlanOptions(bytes_per_param, device, checkpointing, schemes))
