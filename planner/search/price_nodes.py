"""Stage 3 of `planner.search.build`, the nodes: each decision's choices priced from its ops' costs.

A choice's seconds, states and working set are its ops' (summed, the largest working set); its saved bytes
are the storages its ops save for the backward, each counted once per block (`price_choices`): what several
decisions of one block save in one layout is one tensor, as the plan's accounting (`planner.plans.assemble`)
counts it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace

from cost_models.layout import Layout
from cost_models.ops import OpNode
from cost_models.optimizer import op_optimizer_bytes, solver_optimizer_bytes
from cost_models.strategies.base import tensor_key
from cost_models.strategy import HEAVY_SCHEMES, Strategy
from cost_models.strides import is_view, runtime_strides
from planner.search.decisions import Decision, Enumerated, Grouped
from planner.search.solve.problem import Choice, ProblemNode
from planner.trace.graph import ModelGraph

__all__ = ["price_choices", "producer_keys", "saved_before", "views_as_it_flows"]


def _out_layout(strategy: Strategy, producer: OpNode, consumer: OpNode) -> Layout:
    if len(strategy.outputs) > 1 and consumer.kind == "getitem":
        return strategy.outputs[int(consumer.attrs["index"])]
    return strategy.outputs[0]


def views_as_it_flows(op: OpNode, producer: OpNode, strategy: Strategy, made: Strategy, nodes: Mapping[str, OpNode],
                      device: str, memo: dict[str, tuple[int, ...] | None]) -> bool:
    """Whether `op`, taking `strategy`, outputs a view of its first input, `producer`'s single output as it flows
    to `op` unconverted (`producer` taking `made`): the plan's test of a saved view (`planner.plans.storage`),
    with the run-time strides on `device` (`memo`: `runtime_strides`' cache)."""
    return (len(op.outputs) == 1 and bool(op.input_meta) and len(producer.outputs) == 1 and bool(strategy.inputs)
            and strategy.inputs[0] == _out_layout(made, producer, op)
            and is_view(op, runtime_strides(producer.name, nodes, device, memo)))


def _labels(d: Decision, strategies: dict[str, list[Strategy]]) -> list[str] | None:
    """The heavy scheme of each choice of a decision led by a heavy op (None for other decisions)."""
    head = strategies[d.ops[0]]
    labels = [head[k].scheme for k in d.members[0]]
    return labels if any(x in HEAVY_SCHEMES for x in labels) else None


def producer_keys(graph: ModelGraph, en: Enumerated) -> set[str]:
    """The saved-tensor keys that can name a producer's own output storage: an op's output in a layout
    one of its strategies gives it to a consumer in (a consumer saving it in another layout converts it
    and keeps a copy of its own, `planner.plans.assemble`)."""
    nodes = {n.name: n for n in graph.nodes}
    return {tensor_key(src, _out_layout(strat, nodes[src], op))
            for op in graph.nodes for src in dict.fromkeys(op.inputs) for strat in en.strategies[src]}


def saved_before(en: Enumerated, g: Grouped, shareable: AbstractSet[str] | None,
                 as_key: Callable[[str], str] = str) -> dict[str, frozenset[str]]:
    """Per decision, the `shareable` saved-tensor keys (None: every one) an earlier decision of its block (or, outside
    every block, an earlier decision outside every block) saves under some choice, each as `as_key` names it:
    `price_choices` counts such a key there only; `held_saved.saved_twice` asks which tensors (`_Saves.tensor`) came
    before."""
    earlier: dict[str | None, set[str]] = {}  # per block (None: outside every block), keys saved before
    out: dict[str, frozenset[str]] = {}
    for d in g.decisions.values():
        seen = earlier.setdefault(d.block, set())
        out[d.name] = frozenset(seen)
        seen |= {as_key(t.key) for op, idx in zip(d.ops, d.members) for k in set(idx) for t in en.costs[op][k].saved
                 if shareable is None or t.key in shareable}
    return out


def price_choices(en: Enumerated, g: Grouped, bytes_per_param: int, optimizer: str,
                  shareable: AbstractSet[str] = frozenset()
                  ) -> tuple[list[ProblemNode], dict[str, str], list[ProblemNode] | None]:
    """One ProblemNode per decision, its choices priced by summing its ops' costs; and, per decision
    identical to one of the previous block (same template ops, same members), that decision's name; and
    the same nodes with what their parameters make the optimizer step hold counted in their states or as
    one more candidate of their transients (`cost_models.optimizer.solver_optimizer_bytes`): the memory row
    of those covers the step too (the step problem, `BuiltProblem.step_problem`; None where no choice
    differs).

    A tensor several decisions of a block save in one layout (a LLaMA layer's q, k and v projections, its
    normalized input) is one storage, counted once by the plan's accounting: a `shareable` key
    (`producer_keys`) an earlier decision of the block saves under some choice counts there only. One copy
    short where they take it in different layouts: the plan's accounting refuses such an answer, and
    `plan_mesh` solves `BuiltProblem.apart` (`shareable` empty: each decision counts what it saves)."""
    pnodes: list[ProblemNode] = []
    step_nodes: list[ProblemNode] = []
    priced: dict[str, list[Choice]] = {}
    with_step: dict[str, list[Choice]] = {}
    same_decision: dict[str, str] = {}
    step_differs = False
    before = saved_before(en, g, shareable)
    for d in g.decisions.values():
        t_ops = [en.copied.get(op) for op in d.ops]
        seen = before[d.name]
        if all(t_ops) and t_ops[0] in g.decision_of:
            dt = g.decisions[g.decision_of[t_ops[0]]]
            if dt.ops == t_ops and dt.members == d.members:
                same_decision[d.name] = dt.name
                priced[d.name], with_step[d.name] = priced[dt.name], with_step[dt.name]
                pnodes.append(ProblemNode(d.name, list(priced[d.name]), d.block, _labels(d, en.strategies)))
                step_nodes.append(ProblemNode(d.name, list(with_step[d.name]), d.block, pnodes[-1].labels))
                continue
        choices, step_choices = [], []
        for c in range(len(d.members[0])):
            oc = [en.costs[op][idx[c]] for op, idx in zip(d.ops, d.members)]
            step = [solver_optimizer_bytes(optimizer, op_optimizer_bytes(optimizer, x.param_elems, x.largest_param_elems,
                                                                         bytes_per_param)) for x in oc]
            saved: dict[str, int] = {}
            for cost in oc:
                for t in cost.saved:
                    if t.key not in seen:
                        saved[t.key] = t.bytes
            choices.append(Choice(
                time_s=sum(x.time_s for x in oc),
                recompute_s=sum(x.recompute_s for x in oc),
                state_bytes=sum(x.state_bytes for x in oc),
                saved_bytes=sum(saved.values()),
                transient_bytes=max(x.transient_bytes for x in oc),
            ))
            step_choices.append(replace(choices[-1], state_bytes=choices[-1].state_bytes + sum(s for s, _ in step),
                                        transient_bytes=max([choices[-1].transient_bytes] + [t for _, t in step])))
            step_differs = step_differs or step_choices[-1] != choices[-1]
        priced[d.name], with_step[d.name] = choices, step_choices
        pnodes.append(ProblemNode(d.name, choices, d.block, _labels(d, en.strategies)))
        step_nodes.append(ProblemNode(d.name, step_choices, d.block, pnodes[-1].labels))
    return pnodes, same_decision, step_nodes if step_differs else None


