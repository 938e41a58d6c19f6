"""Reduced-cost fixing (`planner.search.solve.fixing`): every option's (and pair of options') bound is at most the
time of every fitting assignment that uses it (brute force over all assignments and checkpoint sets of random problems, one range of
max-term levels or two), the restricted problem measures its assignments as the whole one does, and `solve(prove=
True)` returns the brute-force optimum, proven, where the priced search alone leaves a gap."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_problems import every_assignment, repeated_blocks

from planner.search.solve import brute_force, fixing, solve
from planner.search.solve.block_dp import Price
from planner.search.solve.evaluate import evaluate_indexed
from planner.search.solve.ilp import build_flat
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.milp import solve_milp
from planner.search.solve.priced_bound import transient_levels


@pytest.mark.parametrize("seed, fraction", [(700, 0.8), (702, 0.7), (705, 0.6), (700, 0.9)])
def test_an_option_bound_is_at_most_every_fitting_assignment_that_uses_it(seed: int, fraction: float) -> None:
    """Budgets where the optimum checkpoints one or both blocks (so the checkpointed sets' costs matter)."""
    problem = repeated_blocks(np.random.default_rng(seed), n_blocks=2, block_nodes=3, choices=3, budget_fraction=fraction)
    ip = IndexedProblem(problem)
    m = len(ip.block_nodes)
    levels = transient_levels(ip)
    floor = float(levels[0])  # every assignment's max term is at least the least transient
    mid = float(levels[len(levels) // 2])
    scale = float(np.mean([t.mean() for t in ip.time])) / float(np.mean([s.mean() for s in ip.state]))
    fitting = [(c, t) for c, _, t, peak, _ in every_assignment(ip) if peak <= ip.budget]
    best = min(t for _, t in fitting)
    cut = pair_cut = 0
    for f in (0.0, 1.0):  # recomputed bytes priced at none or all of b / M
        for split in (False, True):  # one range of levels, or two: up to mid (capped) and above it
            bounds = np.full(sum(ip.sizes), -np.inf)
            pairs = {k: np.full((ip.sizes[e.src], ip.sizes[e.dst]), -np.inf) for k, e in enumerate(ip.edges)}
            for b in scale * np.geomspace(1e-3, 1e3, 13):  # every price proves a bound: keep the best
                price = Price(1.0, b, f * b / m)
                ranges = [(floor, price)] if not split else [
                    (floor, Price(1.0, b, f * b / m, cap=mid)), (float(levels[levels > mid][0]), price)]
                bounds = np.maximum(bounds, np.concatenate(fixing.option_bounds(ip, ranges)))
                for k, table in enumerate(fixing.pair_bounds(ip, ranges)):
                    pairs[k] = np.maximum(pairs[k], table)
            per_node = np.split(bounds, np.cumsum(ip.sizes)[:-1])
            for choice, time_s in fitting:
                for v, c in enumerate(choice):
                    assert per_node[v][c] <= time_s * (1 + 1e-9)
                for k, e in enumerate(ip.edges):
                    assert pairs[k][choice[e.src], choice[e.dst]] <= time_s * (1 + 1e-9)
            cut += int((bounds >= best).sum())
            # pairs cut although neither of their options is
            pair_cut += sum(int(((table >= best) & (per_node[e.src] < best)[:, None] & (per_node[e.dst] < best)[None, :]).sum())
                            for table, e in zip(pairs.values(), ip.edges))
    assert cut > 0 and pair_cut > 0  # some options and pairs can be fixed: the checks above are not vacuous


def test_a_restricted_problem_measures_its_assignments_as_the_whole_one() -> None:
    rng = np.random.default_rng(11)
    ip = IndexedProblem(repeated_blocks(rng, n_blocks=2, block_nodes=3, choices=3, shared=[40, 80, 120]))
    keep = [np.sort(rng.choice(s, size=max(1, s - 1), replace=False)) for s in ip.sizes]
    small = fixing.restrict(ip, keep)
    for _ in range(50):
        local = [int(rng.integers(len(k))) for k in keep]
        ckpt = [b for b in range(len(ip.block_nodes)) if rng.random() < 0.5]
        assert evaluate_indexed(small, local, ckpt) == evaluate_indexed(ip, [int(k[i]) for k, i in zip(keep, local)], ckpt)


@pytest.mark.parametrize("prove", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5])  # (seed 4 draws a budget nothing fits)
def test_prove_returns_the_optimum_proven(seed: int, prove: bool) -> None:
    """Random problems where the priced search alone ends 5-11 % above its bound (one of them above the
    optimum): the brute-force optimum, status optimal, with `prove` and without (at most four blocks: the
    same flat ILP over what can beat the answer, with a work limit these small ILPs stay far below)."""
    rng = np.random.default_rng(900 + seed)
    problem = repeated_blocks(rng, n_blocks=3, block_nodes=3, choices=3, residual=seed % 2 == 0,
                              budget_fraction=float(rng.uniform(0.45, 0.8)))
    ref = brute_force(problem)
    assert ref.status == "optimal"
    sol = solve(problem, method="priced", prove=prove)
    assert sol.status == "optimal" and sol.gap <= 1e-6
    assert sol.objective == pytest.approx(ref.objective, rel=1e-9) and sol.peak_bytes <= problem.budget_bytes


@pytest.mark.parametrize("seed, fraction", [(700, 0.8), (705, 0.6)])
def test_a_set_bound_is_at_most_every_fitting_assignment_that_checkpoints_that_set(seed: int, fraction: float) -> None:
    """`set_bounds`: per set of checkpointed blocks, each option's (and pair's) bound is at most the time of every
    fitting assignment that checkpoints exactly that set and takes it; and some set's bounds rise above the least
    over all sets (`option_bounds`), which is what lets `prove` skip whole sets."""
    problem = repeated_blocks(np.random.default_rng(seed), n_blocks=2, block_nodes=3, choices=3, budget_fraction=fraction)
    ip = IndexedProblem(problem)
    m = len(ip.block_nodes)
    floor = float(transient_levels(ip)[0])
    scale = float(np.mean([t.mean() for t in ip.time])) / float(np.mean([s.mean() for s in ip.state]))
    fitting = [(c, frozenset(k), t) for c, k, t, peak, _ in every_assignment(ip) if peak <= ip.budget]
    raised = 0
    for b in scale * np.geomspace(1e-2, 1e2, 5):
        ranges = [(floor, Price(1.0, b, 0.5 * b / m))]
        per_set = fixing.set_bounds(ip, ranges)
        assert set(per_set) == set(fixing.checkpoint_sets(ip)) and len(per_set) == 2 ** m
        for choice, ckpt, time_s in fitting:
            nodes, pairs = per_set[ckpt]
            assert all(nodes[v][c] <= time_s * (1 + 1e-9) for v, c in enumerate(choice))
            assert all(pairs[k][choice[e.src], choice[e.dst]] <= time_s * (1 + 1e-9) for k, e in enumerate(ip.edges))
        least = fixing.option_bounds(ip, ranges)
        raised += sum(int((nodes[v] > least[v] + 1e-12).sum()) for nodes, _ in per_set.values() for v in range(ip.n))
    assert raised > 0


@pytest.mark.parametrize("seed, fraction", [(0, 0.8), (3, 0.7), (8, 0.8)])
def test_the_flat_ilp_with_its_checkpointed_set_fixed_is_that_sets_optimum(seed: int, fraction: float) -> None:
    """`build_flat(checkpointed=)`: for every set of blocks, the flat ILP with that set fixed finds the fastest
    fitting assignment that checkpoints exactly it (brute force), or none where none fits."""
    problem = repeated_blocks(np.random.default_rng(600 + seed), n_blocks=2, block_nodes=3, choices=3,
                              residual=seed % 2 == 0, shared=[40, 80, 120], budget_fraction=fraction)
    ip = IndexedProblem(problem)
    best: dict[frozenset[int], float] = {}
    for _, ckpt, time_s, peak, _ in every_assignment(ip):
        if peak <= ip.budget:
            best[frozenset(ckpt)] = min(best.get(frozenset(ckpt), np.inf), time_s)
    assert len(best) >= 2  # several sets fit: the cases differ
    for sets in fixing.checkpoint_sets(ip):
        built = build_flat(ip, "time", ip.budget, checkpointed=sets)
        res = solve_milp(built.model, work_limit=None)
        if sets not in best:
            assert res.status == "infeasible"
            continue
        assert res.status == "optimal"
        choice, blocks = built.extract(res.x)
        assert frozenset(blocks) == sets
        time_s, peak, _ = evaluate_indexed(ip, choice, blocks)
        assert peak <= ip.budget and time_s == pytest.approx(best[sets], rel=1e-9)
