"""Saved bytes on an edge (`ProblemEdge.saved_bytes`: a tied head's copy of the embedding weight, which
depends on both ops' choices) count like saved activations in every solver.

Synthetic problems shaped like a tied language model: embed -> identical blocks -> head, plus an edge from
embed to head that saves bytes for some choice pairs. The formulas count them once per assignment; the
exact solvers agree with brute force; the priced search's answers fit with them and its bound stays a lower
bound; and they change the optimum on some instances (else the agreement would prove nothing).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from synthetic_problems import repeated_blocks

from planner.search.solve import ProblemError, brute_force, evaluate, solve
from planner.search.solve.problem import ProblemEdge


def _tied(seed: int) -> tuple:
    """A problem with an embed -> head edge saving bytes where the two choices differ, and the same
    problem without it."""
    rng = np.random.default_rng(9100 + seed)
    bare = repeated_blocks(rng, n_blocks=3, block_nodes=3, choices=2, residual=seed % 2 == 0,
                           budget_fraction=float(rng.uniform(0.45, 0.95)))
    copy_bytes = int(rng.integers(200, 900))
    tied = copy.deepcopy(bare)
    zero = np.zeros((2, 2))
    tied.edges.append(ProblemEdge("embed", "head", zero, zero, saved_bytes=np.array([[0, copy_bytes], [copy_bytes, 0]])))
    return tied, bare


def test_counted_once_per_assignment() -> None:
    tied, bare = _tied(0)
    choice = {n.name: 0 for n in tied.nodes}
    for embed, head, extra in ((0, 0, 0), (0, 1, True), (1, 0, True), (1, 1, 0)):
        choice |= {"embed": embed, "head": head}
        for ckpt in ((), ("L0", "L2")):
            diff = evaluate(tied, choice, ckpt)[1] - evaluate(bare, choice, ckpt)[1]
            assert diff == (tied.edges[-1].saved_bytes[embed, head] if extra else 0)


def test_the_copy_changes_the_optimum() -> None:
    changed = 0
    for seed in range(8):
        tied, bare = _tied(seed)
        a, b = brute_force(tied), brute_force(bare)
        changed += (a.status, a.objective, a.choice) != (b.status, b.objective, b.choice)
    assert changed >= 3


@pytest.mark.parametrize("seed", range(8))
def test_every_solver_counts_the_copy(seed: int) -> None:
    tied, _ = _tied(seed)
    ref = brute_force(tied)
    for method in ("flat", "two_level"):
        got = solve(tied, method=method)
        assert got.status == ref.status, method
        if ref.status == "optimal":
            assert got.objective == pytest.approx(ref.objective, rel=1e-9)
            assert evaluate(tied, got.choice, got.checkpointed)[1] <= tied.budget_bytes
        else:
            assert got.min_feasible_budget == ref.min_feasible_budget, method
    priced = solve(tied, method="priced")
    if ref.status == "optimal":
        assert priced.status in ("optimal", "feasible")
        assert evaluate(tied, priced.choice, priced.checkpointed)[1] <= tied.budget_bytes
        assert priced.objective >= ref.objective * (1 - 1e-9) and priced.bound <= ref.objective * (1 + 1e-9)
    else:
        assert priced.status == "infeasible" and priced.min_feasible_budget >= ref.min_feasible_budget


def test_only_into_nodes_outside_the_blocks() -> None:
    tied, _ = _tied(0)
    zero = np.zeros((2, 2))
    tied.edges.append(ProblemEdge("embed", "L0.op0", zero, zero, saved_bytes=np.ones((2, 2), dtype=np.int64)))
    with pytest.raises(ProblemError, match="only edges into nodes outside every block"):
        solve(tied)
