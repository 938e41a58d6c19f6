"""Tensors that blocks read beside their input (HF LLaMA's rotary cos and sin, and its attention mask):
the solver's problem and the assembled plan keep the same bytes of them.

HF LLaMA on 8 ranks with both layers checkpointed: the problem's saved and kept bytes (`evaluate`'s
breakdown) equal the plan's activations, for several assignments. Before `SharedInput` the problem kept
only each layer's hidden-state input and counted 12,288 B a rank fewer than the plan (the account then
sent such answers back for a whole re-solve)."""

from __future__ import annotations

from zoo import build

from cost_models.hardware import load_profile
from cost_models.mesh import Mesh
from planner.plans.assemble import assemble_plan
from planner.search.build import build_problem
from planner.search.solve import Solution, evaluate
from planner.trace.tracer import capture


def test_checkpointed_layers_keep_what_the_plan_keeps() -> None:
    ex = build("hf-llama")
    graph = capture(ex.model, ex.example_inputs, name="hf-llama")
    hw = load_profile("cpu-gloo")
    built = build_problem(graph, Mesh((8,)), hw, 1 << 30, device="cpu")
    problem = built.problem
    blocks = [b.name for b in problem.blocks]
    assert len(blocks) == 2
    # the rotary tables and the mask, each read by both layers
    assert len(problem.shared_inputs) == 3 and all(k.blocks == blocks for k in problem.shared_inputs)
    for c in range(3):
        choice = {n.name: min(c, len(n.choices) - 1) for n in problem.nodes}
        _, _, parts = evaluate(problem, choice, blocks)
        plan = assemble_plan(graph, built, Solution("optimal", choice, blocks), hw, budget_bytes=1 << 30,
                             device="cpu", bytes_per_param=16, checkpointing=True, schemes=None)
        assert parts["saved_bytes"] + parts["kept_input_bytes"] == plan.predicted.activation_bytes, c
