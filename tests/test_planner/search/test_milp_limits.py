"""The work-counted limits of `solve_milp` on a MILP that needs many branch-and-bound nodes (a random
multi-row 0-1 knapsack): a stall limit only stops the search, so the answer is the one a node limit at
the same count gives, and it is reported as such; and a work-limited answer does not depend on the number
of threads HiGHS would pick on the machine."""

from __future__ import annotations

import numpy as np
import pytest

from planner.search.solve import milp
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


def test_a_work_limited_answer_does_not_depend_on_the_machines_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # HiGHS's default thread count follows the machine's cores, and so does its search: on this knapsack, with
    # a work limit of 200,000, 1 thread stops after 29 nodes, 2 prove the optimum in ~9,000 and 4 in ~7,300; at
    # 50,000 (here) 1 thread explores 2 nodes, 4 threads 1. A machine's default is simulated by the thread count
    # the solver object comes with.
    model = _knapsack(items=100, rows=8)
    made = milp._quiet_highs
    found = []
    for threads in (1, 4):
        def preset(threads: int = threads) -> object:
            h = made()
            h.setOptionValue("threads", threads)
            return h
        monkeypatch.setattr(milp, "_quiet_highs", preset)
        res = solve_milp(model, work_limit=50_000)
        found.append((res.status, res.objective, res.nodes))
    assert found[0] == found[1]
