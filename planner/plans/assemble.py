"""From a solved problem back to a `Plan`: per-op assignments, redistributions and the prediction.

The numbers follow the accounting contract in `planner.plans.format` (what `planner explain` adds up), and
are recomputed here op by op from the cost model rather than read from the solver, so a plan's
prediction is exact for its own assignment (saved tensors shared by several ops count once).
"""

from __future__ import annotations

from cost_models.edges import edge_cost, grad_flow, output_working_set
from cost_models.grad_buffers import (
    gradient_buffers,
    gradients_alive,
    passthrough_candidates,
    tracked_gradients,
)
from cost_models.hardware import HardwareProfile
from cost_models.memory import (
    conversion_pair_working_set,
    conversion_working_set,
    dropout_grad_before_mask,
    step_peak,
)
from cost_models.ops import OpNode
from cost_models.optimizer import op_optimizer_bytes, optimizer_step_bytes, resolve_optimizer
from cost_models.strategies.base import param_key, tensor_key
from cost_models.strategy import Strategy
from planner.plans.format import (
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
from planner.plans.recompute import before_recomputation, recomputation_peaks
from planner.plans.storage import storage_bases
from planner.search.build import BuiltProblem, _out_layout
from planner.search.solve import Solution
from planner.search.solve.problem import FORMULAS_ONLY
from planner.search.tied import copy_bytes, tied_uses
from planner.trace.graph import ModelGraph

__all__ = ["assemble_plan", "solver_info"]


def _forward_bytes(cost) -> int:
    """Bytes of an op's forward collectives: they run again when its block is checkpointed."""
    return sum(c.bytes for c in cost.collectives if c.phase == "forward")


def _json_value(v):
    return [_json_value(x) for x in v] if isinstance(v, tuple | list) else v


def _base_key(key: str, nbytes: int, bases: dict[str, str], graph: ModelGraph, built: BuiltProblem,
              pick: dict[str, int]) -> tuple[str, int]:
    """The key and bytes a saved tensor counts under: a view of another op's output (`storage_bases`)
    keeps that output's whole storage, so it counts as that output (once, at its full size)."""
    head, sep, rest = key.partition(":")
    base = bases.get(head)
    if base is None or not rest.startswith("["):  # not a tensor as it flows ("<op>:<what>:..." copies)
        return key, nbytes
    node = graph.node(base)
    lay = built.strategies[base][pick[base]].outputs[0]
    return tensor_key(base, lay), max(nbytes, lay.local_numel(node.out.shape, built.mesh) * node.out.itemsize)


def _tied_copies(graph: ModelGraph, built: BuiltProblem, pick: dict[str, int]) -> dict[str, int]:
    """Bytes a linear whose weight an earlier op also uses (a tied head) saves beyond what its rule prices:
    its copy of the weight (`planner.search.tied`, the same bytes the solver's problem holds on an edge)."""
    out: dict[str, int] = {}
    for use in tied_uses(graph):
        home = graph.node(use.home)
        n = copy_bytes(use, home, built.strategies[use.home][pick[use.home]], built.strategies[use.user][pick[use.user]],
                       built.costs[use.user][pick[use.user]], built.mesh)
        if n:
            out[use.user] = out.get(use.user, 0) + n
    return out


def _state_moves(graph: ModelGraph, built: BuiltProblem, pick: dict[str, int]) -> dict[str, int]:
    """Parameter elements to move, in the plan's accounting, from the op that stores a tied parameter (its
    first user) to its last user: the backward reaches the last user first, and the gradient exists from
    then on (autograd holds the head's contribution until the embedding's is added), so that is where
    `step_peak` must see it appear. Op name -> elements (negative at the home); the total is unchanged."""
    moves: dict[str, int] = {}
    for name, users in graph.shared_params().items():
        home, last = users[0], users[-1]
        node = graph.node(home)
        index = next(i for i, p in enumerate(node.params) if p.name == name)
        info = node.params[index]
        lay = dict(built.strategies[home][pick[home]].params).get(param_key(node, index))
        if lay is None or home == last:
            continue
        n = lay.local_numel(info.shape, built.mesh)
        moves[home] = moves.get(home, 0) - n
        moves[last] = moves.get(last, 0) + n
    return moves


def _gradient_bytes(graph: ModelGraph, built: BuiltProblem, pick: dict[str, int]) -> dict[str, int]:
    """Op name -> bytes of the gradient of its output on this rank (the layout it produces), for the ops
    whose output's gradient `gradient_buffers` tracks (`tracked_gradients`)."""
    out: dict[str, int] = {}
    for name in tracked_gradients(graph.nodes):
        op = graph.node(name)
        lay = built.strategies[name][pick[name]].outputs[0]
        out[name] = lay.local_numel(op.out.shape, built.mesh) * op.out.itemsize
    return out


def _passthrough(graph: ModelGraph, built: BuiltProblem, pick: dict[str, int]) -> dict[str, str]:
    """Tensor -> its last reader, when that reader hands its output's gradient back to it unchanged (the
    same storage): a `passthrough_candidates` entry whose tensor reaches the reader with no conversion
    under the chosen layouts (see `gradient_buffers`)."""
    nodes = {n.name: n for n in graph.nodes}
    out: dict[str, str] = {}
    for src, (op, arg) in passthrough_candidates(graph.nodes).items():
        strat = built.strategies[op.name][pick[op.name]]
        if arg < len(strat.inputs) and strat.inputs[arg] == _out_layout(built.strategies[src][pick[src]], nodes[src], op):
            out[src] = op.name
    return out


def _output_working_set(op: OpNode, strat: Strategy, built: BuiltProblem, pick: dict[str, int],
                        nodes: dict[str, OpNode], flows: dict[str, bool], hw: HardwareProfile, input_mode: str) -> int:
    """The largest `output_working_set` of the graph's outputs under the chosen layouts (the solver prices
    each as an edge into the output node: the same figure)."""
    most = 0
    for arg, src in enumerate(op.inputs):
        have = strat.inputs[arg] if arg < len(strat.inputs) and strat.inputs[arg] is not None else \
            _out_layout(built.strategies[src][pick[src]], nodes[src], op)
        most = max(most, output_working_set(op.input_meta, arg, have, input_mode, built.mesh, hw, grad=flows[src]))
    return most


def solver_info(sol: Solution) -> SolverInfo:
    """The plan's solver block: how `sol` was found, its status, gap and bound (None where NaN: unknown). An answer
    proven optimal for the solver's formulas only (not by the held rows at the budget, `Solution.plan_proven`) says
    so in its message (`FORMULAS_ONLY`): the formulas count some assignments above the plan's accounting."""
    bound = sol.bound if sol.bound == sol.bound else None
    message = sol.message
    if sol.status == "optimal" and not sol.plan_proven and FORMULAS_ONLY not in message:
        message = "; ".join(m for m in (message, FORMULAS_ONLY) if m)
    return SolverInfo(sol.solver, sol.status, sol.objective, sol.gap, sol.seconds, sol.method, bound, message)


def assemble_plan(graph: ModelGraph, built: BuiltProblem, sol: Solution, hw: HardwareProfile, *, budget_bytes: int,
                  device: str, bytes_per_param: int, checkpointing: bool, schemes: list[str] | None,
                  seconds: dict[str, float] | None = None, input_mode: str = "full",
                  optimizer: str | None = None) -> Plan:
    """The plan of `sol`; input_mode: how the caller passes inputs and gets outputs (`INPUT_MODES`), which
    prices the conversion of the outputs to the caller's layout; optimizer: the AdamW implementation the
    step runs (`cost_models.optimizer`; default: torch's for `device`), whose temporaries the optimizer
    step holds beside every state."""
    optimizer = resolve_optimizer(optimizer, device)
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
    conv_extra: dict[str, int] = {}  # node -> what the forward conversions into it hold beyond their source
    # node -> saved-tensor keys of the inputs it gets through a conversion of its own: the runtime converts
    # once per consumer argument, so two ops saving "the same" converted tensor keep two copies.
    own_copy: dict[str, dict[str, int]] = {}  # node -> {key: the copy's bytes (contiguous, local size)}
    flows = grad_flow(graph.nodes)
    for op in graph.nodes:
        strat = built.strategies[op.name][pick[op.name]]
        for arg, src in enumerate(op.inputs):
            lu = _out_layout(built.strategies[src][pick[src]], nodes[src], op)
            lv = strat.inputs[arg]
            if lv is None or lu == lv:
                continue
            meta = op.input_meta[arg]
            own_copy.setdefault(op.name, {})[tensor_key(src, lv)] = lv.local_numel(meta.shape, mesh) * meta.itemsize
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
            if ec.forward:  # what the forward conversion holds beyond its source (re-run when checkpointed)
                conv_extra[op.name] = max(conv_extra.get(op.name, 0), conversion_working_set(
                    ec.forward, meta.shape, meta.itemsize, mesh) - lu.local_numel(meta.shape, mesh) * meta.itemsize)
        if op.kind == "output":
            edge_ws[op.name] = max(edge_ws.get(op.name, 0), _output_working_set(op, strat, built, pick, nodes, flows, hw,
                                                                                  input_mode))

    tied_copy = _tied_copies(graph, built, pick)
    # Recomputed activations of a checkpointed block alive while one of its ops is differentiated: those
    # of the ops up to and including it (in forward order; the later ones are freed by then).
    block_saved: dict[str, int] = {}
    recomputed_upto: dict[str, int] = {}
    seen_keys: set[str] = set()
    op_saved: dict[str, int] = {}
    bases = storage_bases(graph, built, pick, device)
    # A checkpointed block keeps its inputs (every tensor from outside it that its ops read, e.g. the hidden
    # state and the attention mask): each charged to the first op in the block that reads it, a tensor kept
    # by several blocks (the mask) once. kept_in: per block, the saved-tensor keys of those storages (the
    # recomputation runs on these very tensors, so a recomputed op saving one, or a view of one, saves
    # nothing new; a converted copy, keyed `<key>@<op>`, is a new storage).
    kept: dict[str, int] = {}
    kept_in: dict[str, set[str]] = {}
    kept_keys: set[tuple[str, object]] = set()
    for b in graph.blocks:
        if b.name not in ckpt:
            continue
        inside = set(b.nodes)
        for n in b.nodes:
            for src in dict.fromkeys(s for s in nodes[n].inputs if s not in inside):
                lay = _out_layout(built.strategies[src][pick[src]], nodes[src], nodes[n])
                kept_in.setdefault(b.name, set()).add(_base_key(tensor_key(src, lay), 0, bases, graph, built, pick)[0])
                if (src, lay) in kept_keys:
                    continue
                kept_keys.add((src, lay))
                meta = nodes[src].out
                kept[n] = kept.get(n, 0) + lay.local_numel(meta.shape, mesh) * meta.itemsize

    saves: dict[str, set[str]] = {}  # op -> the storage keys of what it saves
    block_fresh: dict[str, int] = {}  # checkpointed op -> bytes of the storages it is the first to save
    unsaved_copies: dict[str, int] = {}  # op -> bytes of converted inputs it reads and does not save
    for op in graph.nodes:
        cost = built.costs[op.name][pick[op.name]]
        fresh = rekept = 0
        copies = own_copy.get(op.name, {})
        saved_keys = {t.key for t in cost.saved}
        unsaved_copies[op.name] = sum(n for k, n in copies.items() if k not in saved_keys)
        mine = saves.setdefault(op.name, set())
        for t in cost.saved:
            nbytes = t.bytes
            if t.key in copies:
                key = f"{t.key}@{op.name}"
                # a converted copy is saved whole, even where the rule prices a view (repeat_kv's k/v)
                nbytes = max(t.bytes, copies[t.key])
            else:
                key, nbytes = _base_key(t.key, t.bytes, bases, graph, built, pick)
            mine.add(key)
            if key not in seen_keys:
                seen_keys.add(key)
                fresh += nbytes
                if key in kept_in.get(op.block, ()):
                    rekept += nbytes
        op_saved[op.name] = fresh + tied_copy.get(op.name, 0)
        if in_ckpt[op.name]:
            # a kept input's storage (or a view of it) saved again by the recomputation is nothing new
            # (HF ViT: the first layer norm saving the block's input); a converted copy of it is
            block_fresh[op.name] = fresh - rekept
            block_saved[op.block] = block_saved.get(op.block, 0) + fresh - rekept
            recomputed_upto[op.name] = block_saved[op.block]

    # A checkpointed block's gradient waiting through its recomputation: that of the output of the last op
    # in the block that saves anything (the first the backward reaches that unpacks a saved tensor), in the
    # layout that op produces it. Measured: 524,288 B on a 1d gpt-tiny rank (the replicated (32, 64, 64)
    # gradient of the MLP projection's output, gathered back from the sequence split).
    waiting: dict[str, tuple[str, int]] = {}  # block -> (that op, the gradient's bytes)
    for op in graph.nodes:
        if in_ckpt[op.name] and op_saved[op.name]:
            lay = built.strategies[op.name][pick[op.name]].outputs[0]
            waiting[op.block] = (op.name, lay.local_numel(op.out.shape, mesh) * op.out.itemsize)
    moved = _state_moves(graph, built, pick)
    # In a checkpointed block's backward, recomputed activations are alive together with the working
    # set of the op (or the conversion into it) being differentiated, and the activation gradients
    # autograd holds beside it (cost_models.grad_buffers; the block's gradient waiting through its
    # recomputation among them, once: it may be the residual gradient counted already). The ops after
    # the block's last saving op are differentiated before the recomputation (nothing recomputed yet).
    trigger = {block: name for block, (name, _) in waiting.items()}
    before = before_recomputation(graph, in_ckpt, trigger)
    # A conversion into an op runs before the op's forward and after its backward: the tensors the op saves
    # are not alive beside it (measured: torch-cnn under 3d, the all-gather of fc's input gradient back to
    # replicated is the step's peak, with fc's saved input and weight freed; predicted 11 % over when
    # counted). Outside checkpointed blocks the op's own saved bytes come off the conversion's working set.
    own = [max(built.costs[op.name][pick[op.name]].transient_bytes,
               edge_ws.get(op.name, 0) - (0 if in_ckpt[op.name] else op_saved[op.name]))
           + (recomputed_upto.get(op.name, 0) if in_ckpt[op.name] and op.name not in before else 0)
           for op in graph.nodes]
    also = [waiting.get(op.block) if in_ckpt[op.name] and op.name not in before else None for op in graph.nodes]
    grads, passthrough = _gradient_bytes(graph, built, pick), _passthrough(graph, built, pick)
    transients = gradient_buffers(graph.nodes, grads, own, passthrough, also)
    # The recomputation itself re-runs the whole block at its last saving op (planner.plans.recompute),
    # beside the gradients alive there.
    if trigger:
        alive = gradients_alive(graph.nodes, grads, passthrough)
        index = {op.name: i for i, op in enumerate(graph.nodes)}
        peaks = recomputation_peaks(graph, built, pick, ckpt, bases, saves, block_fresh, unsaved_copies, conv_extra)
        for block, name in trigger.items():
            i = index[name]
            op = graph.nodes[i]
            # the gradient dropout's scaling makes before the mask is unpacked (CPU)
            first = grads.get(name, 0) if op.kind == "dropout" and dropout_grad_before_mask(device) else 0
            transients[i] = max(transients[i], alive[i] + first + peaks[block])
    assignments: list[Assignment] = []
    per_op: list[OpPrediction] = []
    for op, transient in zip(graph.nodes, transients):
        strat = built.strategies[op.name][pick[op.name]]
        cost = built.costs[op.name][pick[op.name]]
        r_secs, r_fwd, r_bytes, r_fwd_bytes = into.get(op.name, (0.0, 0.0, 0, 0))
        ck = in_ckpt[op.name]
        saved = kept.get(op.name, 0) if ck else op_saved[op.name]
        recompute = (cost.recompute_s + r_fwd) if ck else 0.0
        ac = AssignmentCost(state_bytes=cost.state_bytes + moved.get(op.name, 0) * bytes_per_param, saved_bytes=saved,
                            transient_bytes=transient, compute_s=cost.compute_s, comm_s=cost.comm_s,
                            # A checkpointed op re-runs its forward collectives and those of the conversions into
                            # it (as recompute_s counts their seconds).
                            comm_bytes=cost.comm_bytes + (_forward_bytes(cost) + r_fwd_bytes if ck else 0),
                            recompute_s=recompute, optimizer_bytes=op_optimizer_bytes(
                                optimizer, cost.param_elems, cost.largest_param_elems, bytes_per_param))
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
    # The optimizer step holds its temporaries and the caller's inputs beside every state (and nothing the
    # backward saved): the bound is states + the larger of (activations + transient) and that.
    step_bytes = optimizer_step_bytes(optimizer, (a.cost.optimizer_bytes for a in assignments), graph.input_sizes(),
                                      input_mode, mesh)
    trans = max((a.cost.transient_bytes for a in assignments), default=0)
    compute = sum(a.cost.compute_s for a in assignments)
    comm = sum(a.cost.comm_s for a in assignments) + sum(r.seconds for r in redists)
    recompute = sum(a.cost.recompute_s for a in assignments)
    # The step's peak: the backward op (or the optimizer step) where the most is alive together.
    sp = step_peak([(a.cost.state_bytes, a.cost.saved_bytes, a.cost.transient_bytes) for a in assignments],
                   bytes_per_param, optimizer_bytes=step_bytes)
    predicted = Predicted(
        peak_memory_bytes=sp.peak, model_state_bytes=states, activation_bytes=acts,
        transient_bytes=trans, released_bytes=sp.released, optimizer_bytes=step_bytes, step_time_s=compute + comm + recompute,
        compute_s=compute, comm_s=comm,
        comm_bytes=sum(a.cost.comm_bytes for a in assignments) + sum(r.comm_bytes for r in redists),
        recompute_s=recompute, per_op=per_op,
    )
    solver = solver_info(sol)
    inputs = [InputInfo(n.name, list(n.out.shape), n.out.dtype) for n in graph.nodes if n.kind == "input"]
    return Plan(model=ModelInfo(graph.name, graph.fingerprint, inputs), mesh=mesh, budget_bytes=budget_bytes,
                hardware=hw.to_json(), assignments=assignments, redistributions=redists,
                checkpoint=sorted(ckpt, key=lambda b: [x.name for x in graph.blocks].index(b)),
                predicted=predicted, solver=solver,
                options=PlanOptions(bytes_per_param, device, checkpointing, schemes, input_mode, optimizer))
