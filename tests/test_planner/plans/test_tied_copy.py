"""A tied head's copy of the embedding weight: the solver's problem and the plan count the same bytes
(`planner.search.tied`, one definition).

HF GPT-2 (tied lm_head) on 8 ranks: for every pair of (embedding choice, head choice), the working set on
the problem's edge from the embedding's decision to the head's is the head's copy, as the assembled plan
counts it in the head's saved activations, plus the head decision's own working set; no copy, no edge
entry. Some pairs hold a copy (1d: the head's vocab split of the hidden-split embedding).
"""

from __future__ import annotations

import numpy as np

from cost_models.hardware import load_profile
from cost_models.mesh import Mesh
from planner.models.hf_gpt2 import build_hf_gpt2
from planner.plans.assemble import _tied_copies
from planner.search.build import build_problem
from planner.search.tied import tied_uses
from planner.trace.tracer import capture


def test_the_problem_and_the_plan_count_the_same_copy() -> None:
    model, inputs = build_hf_gpt2(seed=0)
    graph = capture(model, inputs, name="hf-gpt2")
    (use,) = tied_uses(graph)
    built = build_problem(graph, Mesh((8,)), load_profile("cpu-gloo"), 1 << 30, device="cpu")
    home, head = built.decision_of[use.home], built.decision_of[use.user]
    (edge,) = [e for e in built.problem.edges if (e.src, e.dst) == (home, head)]
    node = next(n for n in built.problem.nodes if n.name == head)
    choice = {d.name: 0 for d in built.decisions}
    copies = 0
    for i in range(edge.transient_bytes.shape[0]):
        for j in range(edge.transient_bytes.shape[1]):
            choice[home], choice[head] = i, j
            copy = _tied_copies(graph, built, built.strategy_of(choice)).get(use.user, 0)
            expected = copy + node.choices[j].transient_bytes if copy else 0
            assert edge.transient_bytes[i, j] == expected, (i, j)
            copies += copy > 0
    assert copies > 0 and np.count_nonzero(edge.transient_bytes) == copies
