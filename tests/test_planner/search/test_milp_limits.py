"""The work-counted limits of `solve_milp` on a MILP that needs many branch-and-bound nodes (a random
multi-row 0-1 knapsack): a stall limit only stops the search, so the answer is the one a node limit at
the same count gives, and it is reported as such."""

from __future__ import annotations

import numpy as np
import pytest

from planner.search.solve.milp import MilpModel, solve_milp

pytest.importorskip("highspy")


def _knapsack(seed: int = 0, items: int = 60, rows: int = 5) -> MilpModel:
    rng = np.random.default_rng(seed)
    m = MilpModel()
    x = m.add_vars(items, integer=True)
    m.add_cost(x, -rng.integers(10, 100, items).astype(float))  # maximise value
    for _ in range(rows):
        w = rng.integers(5, 60, items).astype(float)
        m.add_row(x, w, hi=float(w.sum() / 3))
    return m


def test_a_stall_limit_stops_where_a_node_limit_at_that_count_stops() -> None:
    model = _knapsack(items=100, rows=8)  # about 9,000 nodes to prove its optimum
    stalled = solve_milp(model, node_limit=None, stall_nodes=20)
    assert stalled.status == "feasible" and "no better solution in 20 nodes" in stalled.message
    assert stalled.nodes < 2_000
    same = solve_milp(model, node_limit=stalled.nodes)  # deterministic: the same search, cut at the same node
    assert same.status == "feasible" and same.objective == stalled.objective
    longer = solve_milp(model, node_limit=stalled.nodes + 2_000)  # more work finds at least as good
    assert longer.objective <= stalled.objective
