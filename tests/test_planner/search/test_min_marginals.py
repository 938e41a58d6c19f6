"""Every node's and edge's min-marginal from one elimination and its pass back (`eliminate.min_marginals`)
equals the elimination that keeps that node or pair (`eliminate(keep=...)`): on random factor graphs (several
components, forbidden choices, batched costs) and on tiny HF LLaMA's whole problem from the zoo (2x2x2),
whose marginals reduced-cost fixing reads (`fixing`)."""

from __future__ import annotations

import numpy as np
import pytest
from zoo_problems import zoo_problem

from planner.search.solve.block_dp import Price
from planner.search.solve.eliminate import eliminate, min_marginals
from planner.search.solve.flat_start import priced_costs
from planner.search.solve.frontier import topological_order
from planner.search.solve.indexed import IndexedProblem, fold_fixed_edges


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to the order floats were added in; infinite (forbidden) exactly where the other is."""
    return a.shape == b.shape and bool(np.all((a == b) | np.isclose(a, b, rtol=1e-12, atol=0)))


def _check(order: list[int], sizes: dict[int, int], unary: dict, incoming: dict, batch: int, every: int = 1) -> None:
    """Each `every`-th node, and the edges into it, against the elimination that keeps them."""
    nodes, pairs = min_marginals(order, sizes, unary, incoming, batch=batch)
    assert set(nodes) == set(order) and set(pairs) == {(u, v) for v in order for u, _ in incoming[v]}
    for v in order[::every]:
        assert _same(nodes[v], eliminate(order, sizes, unary, incoming, keep=[v], batch=batch).value), v
        for u, _ in incoming[v]:
            assert _same(pairs[u, v], eliminate(order, sizes, unary, incoming, keep=[u, v], batch=batch).value), (u, v)


@pytest.mark.parametrize("seed", range(12))
def test_random_graphs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 10))
    batch = int(rng.integers(0, 3))
    lead = (batch,) if batch else ()
    sizes = {v: int(rng.integers(1, 5)) for v in range(n)}
    unary = {v: rng.uniform(0, 1, lead + (sizes[v],)) for v in range(n)}
    for v in range(n):
        if sizes[v] > 1 and rng.random() < 0.3:
            unary[v][..., 0] = np.inf  # a forbidden choice
    incoming: dict[int, list] = {v: [] for v in range(n)}
    for v in range(n):
        for u in range(v):
            if rng.random() < 0.35:  # sparse: often several components
                incoming[v].append((u, rng.uniform(0, 1, lead + (sizes[u], sizes[v]))))
    order = list(rng.permutation(n))
    _check([int(v) for v in order], sizes, unary, incoming, batch)


def test_a_zoo_model_s_whole_problem() -> None:
    budget = 2_000_000
    ip = IndexedProblem(zoo_problem("hf-llama", budget), budget)
    fold_fixed_edges(ip)
    combos = [(0.0, Price(1.0, b, 0.0, cap=cap), frozenset(ckpt))
              for b in (1e-12, 1e-9) for cap in (np.inf, 1e6) for ckpt in ((), (0,))]
    unary, incoming = priced_costs(ip, combos)
    order = topological_order(ip.n, [(e.src, e.dst) for e in ip.edges])
    _check(order, dict(enumerate(ip.sizes)), unary, incoming, len(combos), every=4)
