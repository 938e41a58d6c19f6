"""From a captured graph to the solver's problem: enumerate, cost, group, and price the edges.

Per mesh:
1. Enumerate strategies for every op in execution order; an op's input candidates are the output
   layouts its producers can produce (`cost_models.strategies.enumerate_strategies`).
2. Group ops into *decisions*: a single-input op that can run in every layout its producer's group can
   hand it (element-wise, shape ops, dropout, softmax, ...) joins that group and takes, for each of the
   group's choices, the strategy that needs no conversion (Alpa's "follow" merging). Everything else is
   its own decision.
3. Price each choice of each decision (sum over its ops' `OpCost`s: `planner.search.price_nodes`) and
   each edge between two decisions (a matrix of redistribution costs over their choices; a tied weight's
   copy, a working set on an edge from its owner's decision to its second user's).
4. Map the captured repeated blocks onto decisions, with the bytes a checkpointed block keeps (its input,
   and the tensors from outside it shares with other blocks).

The result is a `Problem` (plain numbers) plus a `BuiltProblem` that remembers which strategy every op
takes under every choice, so a solution can be turned back into per-op assignments.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np

from cost_models import schemes as schemes_mod
from cost_models.edges import edge_cost, grad_flow, output_working_set
from cost_models.hardware import HardwareProfile
from cost_models.layout import Layout
from cost_models.memory import conversion_pair_working_set
from cost_models.mesh import Mesh
from cost_models.ops import OpNode
from cost_models.optimizer import op_optimizer_bytes, optimizer_step_bytes, resolve_optimizer, step_optimizer_bytes
from cost_models.strategies import StrategyError, enumerate_strategies, mark_graph_hints, op_costs, op_signature
from cost_models.strategy import OpCost, SavedTensor, Strategy
from planner.search.decisions import Decision, Enumerated, Grouped
from planner.search.held import held_beside
from planner.search.held_saved import saved_copies, saved_twice, saved_views
from planner.search.price_nodes import _out_layout, price_choices, producer_keys, saved_before
from planner.search.schemes import SchemeError, SchemeUnavailable, expand_schemes, restrict_schemes
from planner.search.solve import fixing
from planner.search.solve.problem import (
    Block,
    HeldLess,
    HeldSaved,
    OptimizerStep,
    Problem,
    ProblemEdge,
    ProblemNode,
    SharedInput,
)
from planner.search.tied import copy_bytes, tied_uses
from planner.trace.graph import ModelGraph

__all__ = ["BuiltProblem", "Decision", "build_problem", "expand_schemes", "SchemeError", "SchemeUnavailable"]


@dataclass
class BuiltProblem:
    """A Problem plus what is needed to read its solution back."""

    mesh: Mesh
    problem: Problem
    decisions: list[Decision]
    strategies: dict[str, list[Strategy]]
    costs: dict[str, list[OpCost]]
    not_offered: dict[str, list[str]]
    decision_of: dict[str, str]
    unsupported: list[str] = field(default_factory=list)
    # `problem` with the optimizer step counted in its memory row too (None when the step holds nothing
    # beyond the states): `solve`'s fallback where the step is what an answer does not fit
    step_problem: Problem | None = None
    # `problem` and `step_problem` with each decision counting every tensor it saves, also one an earlier
    # decision of its block may save (`price_choices`); None where no decision shares a saved tensor
    apart: tuple[Problem, Problem | None] | None = None

    def strategy_of(self, choice: dict[str, int]) -> dict[str, int]:
        """Per-op strategy index for a per-decision choice."""
        out: dict[str, int] = {}
        for d in self.decisions:
            c = choice[d.name]
            for op, idx in zip(d.ops, d.members):
                out[op] = idx[c]
        return out


def _distinct(items: list) -> tuple[list, np.ndarray]:
    """The distinct items in first-seen order and each item's index among them."""
    index: dict = {}
    idx = np.array([index.setdefault(x, len(index)) for x in items], dtype=np.int64)
    return list(index), idx


def _templates(graph: ModelGraph) -> dict[str, str]:
    """op -> the op at the same position of the previous block of the same class, when the two blocks'
    ops have equal signatures position by position and their inputs inside the blocks correspond."""
    out: dict[str, str] = {}
    previous: dict[str, list[str]] = {}
    nodes = {n.name: n for n in graph.nodes}
    for b in graph.blocks:
        prev = previous.get(b.cls)
        previous[b.cls] = b.nodes
        if prev is None or len(prev) != len(b.nodes):
            continue
        pos = {name: i for i, name in enumerate(b.nodes)}
        pos_prev = {name: i for i, name in enumerate(prev)}
        pairs = {}
        for name, t in zip(b.nodes, prev):
            op, top = nodes.get(name), nodes.get(t)
            if op is None or top is None or op_signature(op) != op_signature(top):
                break
            if any(pos.get(a) != pos_prev.get(ta) for a, ta in zip(op.inputs, top.inputs)):
                break
            pairs[name] = t
        else:
            out.update(pairs)
    return out


def _same_inputs(op: OpNode, t: OpNode, strategies: dict[str, list[Strategy]]) -> bool:
    """Whether `op` sees what its template `t` saw: inputs with equal strategies, hence equal candidate
    layouts (inside the block they are usually the very same list, copied from the template's input)."""
    return all(strategies[a] is strategies[ta] or strategies[a] == strategies[ta] for a, ta in zip(op.inputs, t.inputs))


def _renamed(costs: list[OpCost], t: OpNode, op: OpNode) -> list[OpCost]:
    """`costs` of the template op `t` with saved-tensor keys naming `op` and its inputs instead."""
    names = {t.name: op.name} | dict(zip(t.inputs, op.inputs))
    made: dict[SavedTensor, SavedTensor] = {}

    def rename(t: SavedTensor) -> SavedTensor:
        if t not in made:
            head, sep, rest = t.key.partition(":")
            made[t] = SavedTensor(names.get(head, head) + sep + rest, t.bytes)
        return made[t]

    out = []
    for c in costs:
        if not c.saved:
            out.append(c)
            continue
        new = object.__new__(OpCost)  # a copy with other names: skip the dataclass machinery (hot path)
        new.__dict__.update(c.__dict__)
        new.__dict__["saved"] = tuple(rename(k) for k in c.saved)
        out.append(new)
    return out


def _add_edge(edge_mats: dict, pair: tuple[str, str], cost: np.ndarray, rec: np.ndarray, work: np.ndarray,
              unckpt: np.ndarray) -> None:
    """Accumulate an op-level edge into its decision pair: times add up, working sets take the larger."""
    if pair in edge_mats:
        edge_mats[pair][0][:] += cost
        edge_mats[pair][1][:] += rec
        np.maximum(edge_mats[pair][2], work, out=edge_mats[pair][2])
        np.maximum(edge_mats[pair][3], unckpt, out=edge_mats[pair][3])
    else:
        edge_mats[pair] = (cost.copy(), rec.copy(), work.copy(), unckpt.copy())


# the uniform plans a user can ask for with schemes=[...]: the solver also tries each one throughout
UNIFORM_GROUPS = list(schemes_mod.UNIFORM_GROUPS)


def _join_producer(op: OpNode, found: list[Strategy], nodes: dict[str, OpNode],
                   strategies: dict[str, list[Strategy]], decisions: dict[str, Decision],
                   decision_of: dict[str, str]) -> bool:
    """Merge `op` into the decision of its only multi-choice producer when its strategy is a function of
    that input's layout (element-wise, shape ops, layer norm, softmax...): for each of the group's
    choices `op` takes the strategy that needs no conversion of that input. Inputs from single-choice
    decisions (constants, buffers) do not count; their conversions stay priced on their edges."""
    free = [a for a, src in enumerate(op.inputs) if len(decisions[decision_of[src]].members[0]) > 1]
    if len(free) != 1:
        return False
    a = free[0]
    src = op.inputs[a]
    group = decisions[decision_of[src]]
    if group.block != op.block:
        return False
    by_input: dict[Layout | None, int] = {}
    for i, s in enumerate(found):
        if s.inputs[a] in by_input:
            return False  # several strategies per input layout: a real decision
        by_input[s.inputs[a]] = i
    k = group.ops.index(src)
    mapping = []
    for c in range(len(group.members[0])):
        need = _out_layout(strategies[src][group.members[k][c]], nodes[src], op)
        if need not in by_input:
            return False
        mapping.append(by_input[need])
    group.ops.append(op.name)
    group.members.append(mapping)
    decision_of[op.name] = group.name
    return True


def enumerate_ops(graph: ModelGraph, mesh: Mesh, hw: HardwareProfile, *, device: str, bytes_per_param: int,
                  schemes: frozenset[str] | None) -> Enumerated:
    """Offer and cost every op's strategies, given the layouts its producers can hand it.

    An op of a repeated block whose counterpart in the previous identical block has the same signature and
    inputs with the same strategies has the same strategies and costs: they are copied (renamed)."""
    nodes = {n.name: n for n in graph.nodes}
    out = Enumerated({}, {}, {}, {}, [])
    strategies = out.strategies
    template = _templates(graph)
    for op in graph.nodes:
        t = template.get(op.name)
        if t is not None and _same_inputs(op, nodes[t], strategies):
            found, reasons = strategies[t], out.not_offered[t]
            out.costs[op.name] = _renamed(out.costs[t], nodes[t], op)
            out.copied[op.name] = t
        else:
            cands: list[list[Layout]] = []
            for src in op.inputs:
                prod = nodes[src]
                seen: dict[Layout, None] = {}
                for s in strategies[src]:
                    seen[_out_layout(s, prod, op)] = None
                cands.append(list(seen))
            try:
                found, reasons = enumerate_strategies(op, mesh, cands)
            except StrategyError:
                # none of the layouts its producers can hand it suits this op (e.g. a reshape after linears
                # restricted to fsdp): also offer it replicated inputs, the conversion priced on the edge
                cands = [c if any(lay.is_replicated() for lay in c) else c + [Layout.replicated(len(meta.shape))]
                         for c, meta in zip(cands, op.input_meta)]
                found, reasons = enumerate_strategies(op, mesh, cands)
            found, reasons = restrict_schemes(op, found, reasons, schemes)
            if not found:
                raise AssertionError(f"no strategy at all for {op.name} ({op.kind}); the cost model must offer one")
            out.costs[op.name] = op_costs(op, found, mesh, hw, device=device, bytes_per_param=bytes_per_param)
        if op.kind == "other":
            out.unsupported.append(op.name)
        strategies[op.name] = found
        out.not_offered[op.name] = reasons
    return out


def group_decisions(graph: ModelGraph, en: Enumerated) -> Grouped:
    """Each op its own decision, unless it joins its producer's (see `_join_producer`), in execution order."""
    nodes = {n.name: n for n in graph.nodes}
    g = Grouped({}, {})
    for op in graph.nodes:
        found = en.strategies[op.name]
        if not _join_producer(op, found, nodes, en.strategies, g.decisions, g.decision_of):
            g.decisions[op.name] = Decision(op.name, [op.name], [list(range(len(found)))], op.block)
            g.decision_of[op.name] = op.name
    return g


_NO_EDGE = (0.0, 0.0, 0)


def price_edges(graph: ModelGraph, mesh: Mesh, hw: HardwareProfile, en: Enumerated, g: Grouped,
                same_decision: dict[str, str], input_mode: str = "full") -> list[ProblemEdge]:
    """The layout conversions between decisions: per (producer choice, consumer choice), the time, the
    recompute time and the working set of converting each tensor that crosses, summed per decision pair.
    Into a consumer outside the blocks, the working set leaves out what the consumer saves (a conversion
    runs before its forward and after its backward; the plan's accounting counts the same); into one in a
    block, only where its block is not checkpointed (`ProblemEdge.transient_bytes_unckpt`). Each distinct
    (shape, dtype, from, to, gradient) is priced once; a repeated block's edges are copied.
    Into the output node, the conversion of each output to the caller's layout (`input_mode`): its working
    set only (`output_working_set`; its collectives are the caller's, not the step's)."""
    nodes = {n.name: n for n in graph.nodes}
    strategies, decisions, decision_of, copied = en.strategies, g.decisions, g.decision_of, en.copied
    edge_mats: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    memo: dict[tuple, tuple[float, float]] = {}
    # (op, arg) -> its (cost, recompute, working set, the same where its block is not checkpointed) matrices, None
    # when all zero
    edge_of: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None] = {}
    flows = grad_flow(graph.nodes)
    for op in graph.nodes:
        dv = decisions[decision_of[op.name]]
        kv = dv.ops.index(op.name)
        for arg, src in enumerate(op.inputs):
            du = decisions[decision_of[src]]
            if du is dv:
                continue
            ku = du.ops.index(src)
            t = copied.get(op.name)
            if (t is not None and copied.get(src) == nodes[t].inputs[arg] and dv.name in same_decision
                    and du.name in same_decision and (t, arg) in edge_of):
                found_edge = edge_of[(t, arg)]
                edge_of[(op.name, arg)] = found_edge
                if found_edge is not None:
                    _add_edge(edge_mats, (du.name, dv.name), *found_edge)
                continue
            prod = nodes[src]
            meta = op.input_meta[arg]
            # price each distinct (producer layout, consumer layout) pair once, then index
            lus = [_out_layout(strategies[src][k], prod, op) for k in du.members[ku]]
            if op.kind == "output":
                cost = np.zeros((len(lus), len(dv.members[kv])))
                work = np.array([[output_working_set(op.input_meta, arg, lu, input_mode, mesh, hw, grad=flows[src])]
                                 * cost.shape[1] for lu in lus], dtype=np.int64)
                edge_of[(op.name, arg)] = (cost, cost, work, work) if work.any() else None
                if edge_of[(op.name, arg)] is not None:
                    _add_edge(edge_mats, (du.name, dv.name), cost, cost, work, work)
                continue
            lvs = [strategies[op.name][k].inputs[arg] for k in dv.members[kv]]
            ulu, iu = _distinct(lus)
            ulv, iv = _distinct(lvs)
            flow = flows[src]
            rows = []
            for lu in ulu:
                row = []
                for lv in ulv:
                    if lv is None or lu == lv:
                        row.append(_NO_EDGE)
                        continue
                    key = (meta.shape, meta.dtype, lu, lv, flow)
                    got = memo.get(key)
                    if got is None:
                        ec = edge_cost(meta, lu, lv, mesh, hw, grad=flow)
                        work = conversion_pair_working_set(ec.forward, ec.backward, meta.shape, meta.itemsize, mesh)
                        got = memo[key] = (ec.seconds, ec.fwd_seconds, work)
                    row.append(got)
                rows.append(row)
            small = np.asarray(rows, dtype=float).transpose(2, 0, 1)  # (cost, recompute, work) x lu x lv
            cost = small[0][np.ix_(iu, iv)]
            rec = small[1][np.ix_(iu, iv)]
            work = small[2][np.ix_(iu, iv)].astype(np.int64)
            # what the consumer saves is not alive beside its conversions, unless its block is checkpointed
            saved = np.array([en.costs[op.name][k].saved_bytes for k in dv.members[kv]], dtype=np.int64)
            unckpt = np.maximum(work - saved[None, :], 0)
            if dv.block is None:
                work = unckpt
            if not cost.any() and not rec.any() and not work.any():
                edge_of[(op.name, arg)] = None
                continue
            edge_of[(op.name, arg)] = (cost, rec, work, unckpt)
            _add_edge(edge_mats, (du.name, dv.name), cost, rec, work, unckpt)
    return [ProblemEdge(u, v, c, r, w if w.any() else None,
                        transient_bytes_unckpt=o if w.any() and (o != w).any() else None)
            for (u, v), (c, r, w, o) in edge_mats.items()]


def tied_edges(graph: ModelGraph, mesh: Mesh, en: Enumerated, g: Grouped) -> list[ProblemEdge]:
    """Per tied weight used by a linear of another decision outside blocks: an edge from the owner's
    decision to the linear's whose saved bytes, per (owner choice, linear choice), are the linear's copy of
    the weight where it holds one (`planner.search.tied`): saved for its backward, as the plan counts it.
    (Inside a block the copy is left to the plan's accounting, which `solve`'s loop checks.)"""
    out = []
    for use in tied_uses(graph):
        du, dv = g.decisions[g.decision_of[use.home]], g.decisions[g.decision_of[use.user]]
        if du is dv or du.block is not None or dv.block is not None:
            continue
        home = graph.node(use.home)
        ku, kv = du.ops.index(use.home), dv.ops.index(use.user)
        copy = np.array([[copy_bytes(use, home, en.strategies[use.home][i], en.strategies[use.user][j],
                                     en.costs[use.user][j], mesh) for j in dv.members[kv]]
                         for i in du.members[ku]], dtype=np.int64)
        if copy.any():
            zero = np.zeros(copy.shape)
            out.append(ProblemEdge(du.name, dv.name, zero, zero, saved_bytes=copy))
    return out


def block_specs(graph: ModelGraph, mesh: Mesh, en: Enumerated, g: Grouped) -> tuple[list[Block], list[SharedInput]]:
    """The checkpointable blocks: their decisions, and per choice of the decision feeding the block the
    bytes of the input a checkpointed block keeps; and the other tensors from outside that blocks read
    (`SharedInput`), kept once while any of those blocks is checkpointed, as the plan's accounting keeps
    them (HF LLaMA's rotary tables and mask: 36,864 B a rank on the tiny config, 2.4 % of its smallest
    budget, that the solver did not see)."""
    nodes = {n.name: n for n in graph.nodes}
    pblocks: list[Block] = []
    shared: dict[str, SharedInput] = {}
    for b in graph.blocks:
        members = list(dict.fromkeys(g.decision_of[n] for n in b.nodes if n in g.decision_of))
        members = [m for m in members if g.decisions[m].block == b.name]
        if not members:
            continue
        inside = set(b.nodes)
        feeders = [src for n in b.nodes if n in nodes for src in nodes[n].inputs if src not in inside]
        input_node, input_bytes = None, []
        if feeders:
            src = feeders[0]
            du = g.decisions[g.decision_of[src]]
            ku = du.ops.index(src)
            input_node = du.name
            meta = nodes[src].out
            for c in range(len(du.members[0])):
                lay = en.strategies[src][du.members[ku][c]].outputs[0]
                input_bytes.append(lay.local_numel(meta.shape, mesh) * meta.itemsize)
        readers = {src: n for n in reversed(b.nodes) if n in nodes for src in nodes[n].inputs if src not in inside}
        for src in dict.fromkeys(feeders[1:]):
            if src == feeders[0] or src not in g.decision_of:
                continue
            if src not in shared:
                du = g.decisions[g.decision_of[src]]
                ku, meta = du.ops.index(src), nodes[src].out
                lays = [_out_layout(en.strategies[src][du.members[ku][c]], nodes[src], nodes[readers[src]])
                        for c in range(len(du.members[0]))]
                shared[src] = SharedInput(du.name, [lay.local_numel(meta.shape, mesh) * meta.itemsize for lay in lays],
                                          [])
            shared[src].blocks.append(b.name)
        pblocks.append(Block(b.name, members, input_node, input_bytes, b.cls))
    return pblocks, [k for k in shared.values() if any(k.nbytes)]


def optimizer_step(graph: ModelGraph, mesh: Mesh, en: Enumerated, g: Grouped, bytes_per_param: int | str,
                   optimizer: str, input_mode: str) -> OptimizerStep:
    """What the optimizer step holds beside the states, per decision and choice, as the plan counts it
    (`cost_models.optimizer`: its ops' `op_optimizer_bytes` taken together by `step_optimizer_bytes`; the caller's
    inputs fixed): the flat ILP with held rows counts it as a row of its own (`Problem.held_step`)."""
    nbytes = []
    for d in g.decisions.values():
        per = [step_optimizer_bytes(optimizer, [op_optimizer_bytes(optimizer, en.costs[op][idx[c]].param_elems,
                                                                   en.costs[op][idx[c]].largest_param_elems,
                                                                   bytes_per_param) for op, idx in zip(d.ops, d.members)])
               for c in range(len(d.members[0]))]
        if any(per):
            nbytes.append((d.name, per))
    fixed = optimizer_step_bytes(optimizer, [], graph.input_sizes(), input_mode, mesh)
    return OptimizerStep(nbytes, optimizer == "foreach", fixed)


def build_problem(graph: ModelGraph, mesh: Mesh, hw: HardwareProfile, budget_bytes: int, *,
                  device: str = "cuda", bytes_per_param: int = 16, schemes: frozenset[str] | None = None,
                  checkpointing: bool = True, input_mode: str = "full", optimizer: str | None = None) -> BuiltProblem:
    """The solver's problem for `graph` on `mesh`, in four stages with plain data between them: enumerate
    and cost each op's strategies, group followers into their producers' decisions, price choices and
    edges, and list the checkpointable blocks. input_mode: how the caller gets the outputs (`INPUT_MODES`),
    which prices their conversion; optimizer: the AdamW implementation the step runs (`OPTIMIZER_IMPLS`;
    default: torch's for `device`)."""
    mark_graph_hints(graph.nodes)  # fused q/k/v outputs and transposed matmul operands (idempotent)
    en = enumerate_ops(graph, mesh, hw, device=device, bytes_per_param=bytes_per_param, schemes=schemes)
    g = group_decisions(graph, en)
    optimizer = resolve_optimizer(optimizer, device)
    shareable = producer_keys(graph, en)
    pnodes, same_decision, step_nodes = price_choices(en, g, bytes_per_param, optimizer, shareable)
    pedges = price_edges(graph, mesh, hw, en, g, same_decision, input_mode)
    pedges += tied_edges(graph, mesh, en, g)
    blocks, shared = block_specs(graph, mesh, en, g)
    # the gradients held beside each op and the copies saved beyond the formulas: only the proof of a small
    # problem's answer counts them (`fixing.prove`)
    small = len(blocks) <= fixing.MAX_BLOCKS
    held, rerun = held_beside(graph, mesh, en, g, checkpointing, device) if small else ([], [])
    optimizer_held = optimizer_step(graph, mesh, en, g, bytes_per_param, optimizer, input_mode) if small else None

    def problems(nodes: list[ProblemNode], step: list[ProblemNode] | None, copies: list[HeldSaved],
                 less: list[HeldLess]) -> tuple[Problem, Problem | None]:
        return tuple(None if ns is None else Problem(ns, pedges, blocks, int(budget_bytes), checkpointing=checkpointing,
                                                     uniform_groups=UNIFORM_GROUPS, shared_inputs=shared,
                                                     held_beside=held, held_saved=copies, held_less=less,
                                                     held_rerun=rerun, held_step=optimizer_held)
                     for ns in (nodes, step))

    # the copies the problem counting a tensor once leaves out (none counting apart: every decision counts its own),
    # and the storages it may count twice
    def held_saved(before: Mapping[str, AbstractSet[str]], copies: bool) -> tuple[list[HeldSaved], list[HeldLess]]:
        """What the formulas count short of the plan (with `copies`, copies of converted inputs; views of larger
        storages) and beyond it (storages saved twice: some where an earlier decision's choice saves them)."""
        if not small:
            return [], []
        return (saved_copies(graph, en, g, before) if copies else [],
                saved_twice(graph, en, g, before, device) + saved_views(graph, mesh, en, g, before, device))

    problem, step_problem = problems(pnodes, step_nodes, *held_saved(saved_before(en, g, shareable), True))
    apart_nodes, _, apart_step = price_choices(en, g, bytes_per_param, optimizer)
    apart = None if apart_nodes == pnodes else problems(
        apart_nodes, apart_step, *held_saved(saved_before(en, g, frozenset()), False))
    return BuiltProblem(mesh, problem, list(g.decisions.values()), en.strategies, en.costs, en.not_offered,
                        g.decision_of, en.unsupported, step_problem, apart)
