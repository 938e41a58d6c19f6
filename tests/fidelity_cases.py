"""Prediction fidelity cases: plans under every scheme, with and without checkpointing, and what one rank
measures for them (communication bytes, saved activations, peak memory of a training step).

Shared by tests/test_planner/verify/test_peak_memory.py and bench/fidelity.py. A case is (scheme, checkpointed): the uniform
plans come from `plan(schemes=[s])` (tests/apply_plans.py), "mixed" from the rule-picked mixed plan; the
checkpointed variant keeps the same assignment and checkpoints every block (`with_checkpoint`), assembled
by the planner's own `assemble_plan` so its prediction is the cost model's for that assignment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
from apply_checks import call, device_mesh, loss_of
from apply_plans import HARDWARE, UNIFORM_SCHEMES, mixed_plan, uniform_plan

from cost_models.hardware import load_profile
from cost_models.optimizer import optimizer_kwargs
from layers3d.comm import CommCounter
from planner.apply.rewrite import apply_plan
from planner.plans.assemble import assemble_plan
from planner.plans.format import Plan
from planner.search.build import build_problem
from planner.search.solve import Solution
from planner.trace.graph import ModelGraph
from planner.verify.measure import SavedActivationMeter
from planner.verify.measure_memory import step_peak_bytes

__all__ = ["SCHEMES", "with_checkpoint", "make_plans", "measure_rank", "LR", "EPS"]

SCHEMES = (*UNIFORM_SCHEMES, "mixed")
LR, EPS = 1e-3, 1e-6
Build = Callable[[], tuple[nn.Module, Any]]


def with_checkpoint(graph: ModelGraph, p: Plan, blocks: Sequence[str]) -> Plan:
    """`p`'s assignment with exactly `blocks` checkpointed, re-assembled (prediction included)."""
    hw = load_profile(HARDWARE)
    built = build_problem(graph, p.mesh, hw, p.budget_bytes, device="cpu", bytes_per_param=16)
    # the label alone ("follow") does not tell a follow op's layouts apart: match the layouts too
    picked = {a.node: (a.strategy, tuple(a.inputs), tuple(a.outputs)) for a in p.assignments}

    def same(s: Any, op: str) -> bool:
        return (s.label(), tuple(s.inputs), tuple(s.outputs)) == picked[op]

    choice: dict[str, int] = {}
    for d in built.decisions:
        matches = [c for c in range(len(d.members[0]))
                   if all(same(built.strategies[op][m[c]], op) for op, m in zip(d.ops, d.members))]
        if not matches:
            raise AssertionError(f"decision {d.name}: the plan's strategies are not among the built ones")
        choice[d.name] = matches[0]
    sol = Solution("optimal", choice=choice, checkpointed=list(blocks), method="rule")
    return assemble_plan(graph, built, sol, hw, budget_bytes=p.budget_bytes, device="cpu", bytes_per_param=16,
                         checkpointing=True, schemes=p.options.schemes if p.options else None)


def make_plans(graph: ModelGraph, schemes: Sequence[str] = SCHEMES,
               checkpoint: Sequence[bool] = (False, True)) -> dict[tuple[str, bool], Plan]:
    """One plan per (scheme, checkpointed) on 8 ranks (meshes as in tests/apply_plans.py)."""
    blocks = [b.name for b in graph.blocks]
    plans: dict[tuple[str, bool], Plan] = {}
    for s in schemes:
        base = mixed_plan(graph, checkpoint=()) if s == "mixed" else uniform_plan(graph, s)
        for ck in checkpoint:
            plans[(s, ck)] = with_checkpoint(graph, base, blocks if ck else [])
    return plans


def measure_rank(build: Build, p: Plan) -> dict[str, Any]:
    """On one rank: apply `p` to a fresh dense model, then measure one forward/backward (collective bytes,
    saved activations) and the peak memory of a training step (planner.verify.measure_memory)."""
    dense, inputs = build()
    model = apply_plan(dense, p, mesh=device_mesh(p.mesh))
    del dense
    with CommCounter() as counter:
        with SavedActivationMeter.for_module(model) as meter:
            loss = loss_of(call(model, inputs))
        loss.backward()
    comm = sum(c.bytes for c in counter.records if c.tag not in ("io", "tied"))
    unplanned = sum(c.bytes for c in counter.records if c.tag in ("io", "tied"))
    model.zero_grad(set_to_none=True)
    del loss
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, **optimizer_kwargs(p.options.optimizer))
    peak = step_peak_bytes(model, lambda: loss_of(call(model, inputs)), opt)
    pred = p.predicted
    return {"comm": comm, "unplanned_comm": unplanned, "predicted_comm": pred.comm_bytes,
            "activations": meter.bytes, "predicted_activations": pred.activation_bytes,
            "peak": peak["peak"], "peak_start": peak["start"], "peak_op": peak["peak_op"],
            "predicted_peak": pred.peak_memory_bytes, "predicted_states": pred.model_state_bytes,
            "predicted_transient": pred.transient_bytes, "predicted_bound": pred.bound_bytes,
            "peak_phase": peak["peak_phase"]}
