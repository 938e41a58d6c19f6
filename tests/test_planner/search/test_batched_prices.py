"""Prices swept together are swept exactly as one at a time: the batched elimination, block tables and
price sweep give bit-identical minima, minimisers and bounds (the priced search's answers must not depend on
how its prices were grouped). On random factor graphs and on tiny HF BERT from the zoo (2x2x2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from zoo_problems import zoo_problem

from planner.search.solve.block_dp import Price
from planner.search.solve.columns import PricedSolve
from planner.search.solve.decompose import decompose
from planner.search.solve.eliminate import eliminate
from planner.search.solve.indexed import IndexedProblem, fold_fixed_edges, fold_shared_inputs


@pytest.mark.parametrize("seed", range(4))
def test_a_batched_elimination_is_each_elimination(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, batch = 7, 5
    sizes = {v: int(rng.integers(1, 5)) for v in range(n)}
    unary = {v: rng.uniform(0, 1, (batch, sizes[v])) for v in range(n)}
    unary[3][1, 0] = np.inf  # a forbidden choice under one of the costs
    incoming: dict[int, list] = {v: [] for v in range(n)}
    for d in range(1, n):
        for s in range(d):
            if rng.random() < 0.5:
                incoming[d].append((s, rng.uniform(0, 1, (batch, sizes[s], sizes[d]))))
    for keep in ([], [n - 1], [0, n - 1]):
        together = eliminate(list(range(n)), sizes, unary, incoming, keep=keep, batch=batch)
        width = max((sizes[v] for v in keep), default=1)
        given = {v: np.arange(width) % sizes[v] for v in keep}  # a batch of kept values to read back for
        for i in range(batch):
            alone = eliminate(list(range(n)), sizes, {v: u[i] for v, u in unary.items()},
                              {v: [(s, m[i]) for s, m in ins] for v, ins in incoming.items()}, keep=keep)
            assert np.array_equal(together.at(i).value, alone.value)
            picked, expected = together.at(i).argmin(given), alone.argmin(given)
            assert picked.keys() == expected.keys()
            assert all(np.array_equal(picked[v], expected[v]) for v in expected)


@pytest.fixture(scope="module")
def bert_search() -> PricedSolve:
    budget = 1_500_000
    ip = IndexedProblem(zoo_problem("hf-bert", budget), budget)
    fold_fixed_edges(ip)
    fold_shared_inputs(ip)
    return PricedSolve(ip, decompose(ip))


def test_prices_swept_together_give_each_price_s_minimiser(bert_search: PricedSolve) -> None:
    search = bert_search
    groups = search._groups()
    transient = float(np.median(np.concatenate(search.ip.transient)))
    prices = [Price(1.0, search.scale), Price(0.0, 1.0, 1.0), Price(1.0, search.scale * 10, search.scale, cap=transient),
              Price(1.0, search.scale, only=groups[0]), Price(0.0, 1.0, 0.0, cap=transient, only=groups[-1]),
              Price(1.0, search.scale / 10, search.scale / 40), Price(1e-6, 1.0, 1.0 / 12)]
    together = search.evaluate_many(prices, record=False)
    assert len(together) == len(prices)
    for price, r in zip(prices, together):
        alone = search.evaluate(price, record=False)
        assert (r.choice, r.ckpt, r.boundary) == (alone.choice, alone.ckpt, alone.boundary)
        assert (r.time_s, r.peak, r.value) == (alone.time_s, alone.peak, alone.value)
        assert r.bound == alone.bound or (math.isinf(r.bound) and math.isinf(alone.bound))
    # and the minimisers differ: the batch did not hand one price's answer to all
    assert len({tuple(r.choice) for r in together}) > 3
