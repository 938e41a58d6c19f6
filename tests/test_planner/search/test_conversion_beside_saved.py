"""A conversion into an op outside the blocks runs before the op's forward and after its backward: what the
op saves is not alive beside it. The plan's accounting (`assemble_plan`) takes the op's saved bytes off the
conversion's working set; the problem's edge working set takes off the same, so the solver's max term at
that op is the plan's.

A tiny LM (embedding, linear head, cross-entropy) on a 2x4 mesh: for every pair of (choice of the loss's
producer, choice of the loss), the larger of the loss decision's own working set and the edge's equals the
loss op's transient in the assembled plan (before, the problem counted the loss's saved logits beside the
conversion: 39 of 49 pairs over, e.g. 655,360 B against the plan's 523,776 B).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from cost_models.hardware import load_profile
from cost_models.mesh import Mesh
from planner.plans.assemble import assemble_plan
from planner.search.build import build_problem
from planner.search.solve.problem import Solution
from planner.trace.tracer import capture


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(512, 32)
        self.head = nn.Linear(32, 512)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(torch.tanh(self.emb(ids))).flatten(0, 1), labels.flatten())


def test_the_loss_conversion_leaves_out_what_the_loss_saves() -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 512, (8, 16))
    graph = capture(TinyLM(), (ids, ids.clone()))
    hw = load_profile("cpu-gloo")
    built = build_problem(graph, Mesh((2, 4)), hw, 1 << 30, device="cpu")
    problem = built.problem
    loss = next(n for n in problem.nodes if n.name == "cross_entropy")
    (edge,) = [e for e in problem.edges if e.dst == loss.name and e.transient_bytes is not None]
    converted = 0
    for i in range(edge.transient_bytes.shape[0]):
        for j in range(edge.transient_bytes.shape[1]):
            choice = {n.name: 0 for n in problem.nodes} | {edge.src: i, loss.name: j}
            sol = Solution(status="feasible", choice=choice, objective=0.0)
            plan = assemble_plan(graph, built, sol, hw, budget_bytes=1 << 30, device="cpu", bytes_per_param=16,
                                 checkpointing=True, schemes=None)
            planned = next(a for a in plan.assignments if a.node == loss.name).cost.transient_bytes
            assert max(loss.choices[j].transient_bytes, int(edge.transient_bytes[i, j])) == planned, (i, j)
            converted += int(edge.transient_bytes[i, j]) > loss.choices[j].transient_bytes
    assert converted > 0  # some pairs' conversion is the larger term
