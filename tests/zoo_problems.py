"""The solver's problem of a zoo model, as the search tests take it: captured, on 8 ranks' 2x2x2 mesh (the most
strategies per op), under the A100 profile."""

from __future__ import annotations

from zoo import build

from cost_models.hardware import load_profile
from cost_models.mesh import candidate_meshes
from planner.search.build import build_problem
from planner.search.solve.problem import Problem
from planner.trace.tracer import capture

__all__ = ["zoo_problem"]


def zoo_problem(name: str, budget: int = 0) -> Problem:
    """Zoo model `name`'s problem on 2x2x2 with `budget` bytes per rank (0: set by the caller's IndexedProblem)."""
    ex = build(name)
    graph = capture(ex.model, ex.example_inputs, name=name)
    hw = load_profile("a100-80gb")
    return build_problem(graph, candidate_meshes(8, 8)[-1], hw, budget, device=hw.device).problem
