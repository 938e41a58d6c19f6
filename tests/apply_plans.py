"""Plans for the apply/verify tests: uniform schemes from `plan()`, and a hand-mixed plan.

`uniform_plan` forces one scheme on every heavy op (`schemes=[s]`) and a mesh where the scheme is
possible ((8,) for replicate/fsdp/1d, (2, 2, 2) for 2d/3d/3d_allreduce). `mixed_plan` builds the solver's
problem and picks, per decision, a strategy by rule (attention linears 3d, MLP linears 3d_allreduce,
embedding and head vocab-parallel, the layer norms and follow ops whatever needs no conversion from
their producers), checkpoints the given blocks, and assembles the plan with the planner's own
`assemble_plan`, so its redistributions and predictions are those of that assignment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cost_models.hardware import load_profile
from cost_models.mesh import Mesh
from cost_models.strategies import mark_graph_hints
from cost_models.strategy import Strategy
from planner.api import plan
from planner.plans.assemble import assemble_plan
from planner.plans.format import Plan
from planner.search.build import build_problem
from planner.search.solve import Solution
from planner.trace.graph import ModelGraph

__all__ = ["UNIFORM_SCHEMES", "uniform_plan", "mixed_plan", "mesh_for"]

UNIFORM_SCHEMES = ("replicate", "fsdp", "1d", "2d", "3d", "3d_allreduce")
HARDWARE = "cpu-gloo"


def mesh_for(scheme: str, world_size: int = 8) -> Mesh:
    if scheme in ("replicate", "fsdp", "1d"):
        return Mesh((world_size,))
    return Mesh((2, 2, 2))


def uniform_plan(graph: ModelGraph, scheme: str, budget: str | int = "1GiB", world_size: int = 8) -> Plan:
    """plan() with every heavy op restricted to `scheme` on the mesh that scheme needs (CPU semantics)."""
    mark_graph_hints(graph.nodes)
    return plan(graph, budget, world_size=world_size, schemes=[scheme], hardware=HARDWARE,
                meshes=[mesh_for(scheme, world_size)], device="cpu")


def _default_rule(op_name: str, module_path: str, kind: str, s: Strategy) -> bool:
    """The mixed plan: attention 3d, MLP 3d_allreduce, token embedding and head vocab-parallel."""
    if kind == "linear":
        if ".attn." in module_path:
            return s.scheme == "3d" and s.option("save_input") == "gathered"
        if ".mlp." in module_path:
            return s.scheme == "3d_allreduce" and not s.option("weight_shard")
        return s.scheme == "1d_col"  # the vocabulary head: vocab split over T
    if kind == "embedding":
        return s.scheme == "vocab" if module_path.endswith("wte") else s.scheme == "replicate"
    return True


def mixed_plan(graph: ModelGraph, checkpoint: Sequence[str] = ("transformer.h.1",),
               rule: Callable[[str, str, str, Strategy], bool] = _default_rule, mesh: Mesh | None = None,
               budget: int = 1 << 30) -> Plan:
    """A plan assembled from a rule-picked assignment (see the module docstring)."""
    mark_graph_hints(graph.nodes)
    hw = load_profile(HARDWARE)
    built = build_problem(graph, mesh or Mesh((2, 2, 2)), hw, budget, device="cpu", bytes_per_param=16)
    nodes = {n.name: n for n in graph.nodes}
    index = {n.name: i for i, n in enumerate(built.problem.nodes)}
    incoming: dict[str, list] = {}
    for e in built.problem.edges:
        incoming.setdefault(e.dst, []).append(e)
    choice: dict[str, int] = {}
    for d in built.decisions:
        head = nodes[d.ops[0]]
        n_choices = len(d.members[0])
        allowed = [c for c in range(n_choices)
                   if rule(head.name, head.module_path, head.kind, built.strategies[head.name][d.members[0][c]])]
        if not allowed:
            raise AssertionError(f"no strategy of {head.name} ({head.kind}) satisfies the mixed-plan rule")
        cost = np.zeros(n_choices)
        for e in incoming.get(d.name, []):
            if e.src in choice:  # a producer decided later (a follower joined an earlier group) is not priced here
                cost += e.cost_s[choice[e.src], :]
        choice[d.name] = min(allowed, key=lambda c: (cost[c], c))
    assert len(choice) == len(index)
    sol = Solution("optimal", choice=choice, checkpointed=list(checkpoint), method="rule")
    return assemble_plan(graph, built, sol, hw, budget_bytes=budget, device="cpu", bytes_per_param=16,
                         checkpointing=True, schemes=None)
