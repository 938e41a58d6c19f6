"""The priced solve: exact variable elimination and block tables against enumeration, and the priced
search's answers against the exact solvers (feasible, never better than the optimum, gap a true bound)."""

import itertools

import numpy as np
import pytest
from synthetic_problems import repeated_blocks

from planner.search.solve import brute_force, solve
from planner.search.solve.block_dp import BlockDP, Price
from planner.search.solve.decompose import decompose
from planner.search.solve.eliminate import eliminate
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.two_level import usable_columns


def _random_dag(rng: np.random.Generator, n: int) -> tuple[dict, dict, dict]:
    sizes = {v: int(rng.integers(1, 4)) for v in range(n)}
    unary = {v: rng.uniform(0, 1, sizes[v]) for v in range(n)}
    incoming: dict[int, list] = {v: [] for v in range(n)}
    for d in range(1, n):
        for s in range(d):
            if rng.random() < 0.4:
                incoming[d].append((s, rng.uniform(0, 1, (sizes[s], sizes[d]))))
    return sizes, unary, incoming


def _total(assign: dict, unary: dict, incoming: dict) -> float:
    return sum(unary[v][assign[v]] for v in unary) + sum(
        m[assign[u], assign[v]] for v, ins in incoming.items() for u, m in ins)


@pytest.mark.parametrize("seed", range(6))
def test_eliminate_finds_the_minimum_and_its_argmin(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes, unary, incoming = _random_dag(rng, 6)
    keep = [5]
    sweep = eliminate(list(range(6)), sizes, unary, incoming, keep=keep)
    for last in range(sizes[5]):
        best = min(_total(dict(zip(range(6), c)), unary, incoming)
                   for c in itertools.product(*(range(sizes[v]) for v in range(6))) if c[5] == last)
        assert sweep.value[last] == pytest.approx(best, rel=1e-12)
        picked = {v: int(x[0]) for v, x in sweep.argmin({5: np.array([last])}).items()}
        assert _total(picked, unary, incoming) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("residual", [False, True])
def test_block_table_is_the_cheapest_block_per_boundary(residual: bool) -> None:
    problem = repeated_blocks(np.random.default_rng(5), n_blocks=3, block_nodes=4, choices=3, residual=residual)
    ip = IndexedProblem(problem)
    cls = decompose(ip).classes[-1]
    dp, shape = BlockDP(cls.shape), cls.shape
    price = Price(1.0, 2e-6, 1e-6, cap=float(np.median(np.concatenate(shape.transient))))
    table = dp.table(price, checkpointing=True)
    n = len(shape.sizes)
    for p in range(shape.port_size):
        best = np.full(shape.sizes[shape.out_pos], np.inf)
        for choice in itertools.product(*(range(s) for s in shape.sizes)):
            if any(shape.transient[v][c] > price.cap for v, c in enumerate(choice)):
                continue
            for ckpt in (False, True):
                add, top, t = dp.measure(np.array([choice]), np.array([p]), np.array([ckpt]))
                saved = sum(int(shape.saved[v][c]) for v, c in enumerate(choice))
                w = t[0] + price.b * add[0] + (price.c * saved if ckpt else 0.0)
                q = choice[shape.out_pos]
                best[q] = min(best[q], w)
        np.testing.assert_allclose(table.cost[p], best, rtol=1e-12)
    pts = dp.points(table)
    assert pts and all(len(pt.choice) == n for pt in pts)
    for pt in pts:  # each point is a real assignment whose priced cost is the table entry
        saved = sum(int(shape.saved[v][c]) for v, c in enumerate(pt.choice))
        w = pt.time_s + price.b * pt.add_bytes + (price.c * saved if pt.ckpt else 0.0)
        assert w == pytest.approx(table.cost[pt.p, pt.q], rel=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_priced_answers_fit_and_their_gap_bounds_the_optimum(seed: int) -> None:
    rng = np.random.default_rng(4000 + seed)
    problem = repeated_blocks(rng, n_blocks=int(rng.integers(3, 9)), block_nodes=int(rng.integers(3, 6)),
                              choices=int(rng.integers(2, 4)), residual=seed % 2 == 0,
                              checkpointing=seed % 3 != 2, budget_fraction=float(rng.uniform(0.3, 0.9)))
    exact, priced = solve(problem, method="two_level"), solve(problem, method="priced")
    assert priced.method == "priced"
    if exact.status == "optimal":
        assert priced.status in ("optimal", "feasible") and priced.peak_bytes <= problem.budget_bytes
        assert priced.objective >= exact.objective * (1 - 1e-9)
        assert priced.objective * (1 - priced.gap) <= exact.objective * (1 + 1e-9)
    else:
        assert priced.status == "infeasible"
        assert priced.min_feasible_budget >= exact.min_feasible_budget
        problem.budget_bytes = priced.min_feasible_budget  # the budget it reports does fit
        assert solve(problem, method="priced").status in ("optimal", "feasible")


def test_priced_is_exact_when_the_fastest_assignment_fits() -> None:
    problem = repeated_blocks(np.random.default_rng(9), n_blocks=3, block_nodes=3, choices=2, budget_fraction=50.0)
    priced, ref = solve(problem, method="priced"), brute_force(problem)
    assert priced.status == "optimal" and priced.gap == 0.0
    assert priced.objective == pytest.approx(ref.objective, rel=1e-9)


def _with_conversion_work(problem, rng: np.random.Generator):
    """Give some edges conversion working sets (a max-term candidate per choice pair)."""
    for e in problem.edges:
        if rng.random() < 0.5:
            e.transient_bytes = (rng.random(e.cost_s.shape) < 0.5) * rng.integers(0, 3000, e.cost_s.shape)
    return problem


@pytest.mark.parametrize("seed", range(4))
def test_conversion_working_sets_count_in_every_solver(seed: int) -> None:
    rng = np.random.default_rng(5000 + seed)
    problem = _with_conversion_work(repeated_blocks(rng, n_blocks=3, block_nodes=3, choices=2, residual=seed % 2 == 0,
                                                    budget_fraction=float(rng.uniform(0.4, 0.9))), rng)
    ref = brute_force(problem)
    for method in ("flat", "two_level"):
        sol = solve(problem, method=method)
        assert sol.status == ref.status, method
        if ref.status == "optimal":
            assert sol.objective == pytest.approx(ref.objective, rel=1e-9) and sol.peak_bytes <= problem.budget_bytes
        else:
            assert sol.min_feasible_budget == ref.min_feasible_budget, method
    priced = solve(problem, method="priced")
    if ref.status == "optimal":
        assert priced.peak_bytes <= problem.budget_bytes and priced.objective >= ref.objective * (1 - 1e-9)
    else:
        assert priced.status == "infeasible" and priced.min_feasible_budget >= ref.min_feasible_budget


def test_dropping_unusable_columns_keeps_the_column_ilp_optimum() -> None:
    from planner.search.solve.columns import PricedSolve

    dropped = 0
    for seed in (2, 3, 4):  # two budgets that fit and one that does not
        rng = np.random.default_rng(6000 + seed)
        problem = _with_conversion_work(repeated_blocks(
            rng, n_blocks=int(rng.integers(3, 6)), block_nodes=4, choices=3, residual=seed % 2 == 0,
            budget_fraction=float(rng.uniform(0.35, 0.6))), rng)
        ip = IndexedProblem(problem)
        ps = PricedSolve(ip, decompose(ip))
        ps.solve("highs", 30.0)
        full = ps._outer(None)
        ref = full.outer("time", "highs", 1e18)
        kept = ps._outer(None)
        kept.points = usable_columns(ps.ip, ps.dec, kept.points, kept.allowed, np.inf)
        dropped += sum(map(len, full.points)) - sum(map(len, kept.points))
        got = kept.outer("time", "highs", 1e18)
        if not np.isfinite(ref.value):
            assert not np.isfinite(got.value)
            continue
        assert got.value == pytest.approx(ref.value, rel=1e-9)
        # with a bar just above the optimum, the columns that could beat it still include the optimum's
        loose = ps._outer(None)
        loose.points = usable_columns(ps.ip, ps.dec, loose.points, loose.allowed, ref.value * (1 + 1e-6))
        assert loose.outer("time", "highs", 1e18).value == pytest.approx(ref.value, rel=1e-9)
    assert dropped > 0  # the budget did rule columns out


@pytest.mark.parametrize("seed", range(6))
def test_a_beaten_search_could_only_have_lost(seed: int) -> None:
    """`solve(beaten=)` (another mesh's plan is faster than T): the priced search either stops with a lower
    bound above T that its own answer would have had to meet, or, never beaten, gives the same answer as
    without it. Thresholds from well below the answer's bound (always beaten) to above the answer."""
    rng = np.random.default_rng(6000 + seed)
    problem = repeated_blocks(rng, n_blocks=int(rng.integers(4, 9)), block_nodes=4, choices=3, residual=True,
                              budget_fraction=float(rng.uniform(0.6, 0.8)))
    ref = solve(problem, method="priced")
    assert ref.status in ("optimal", "feasible")
    stopped = 0
    for t in (0.5 * ref.bound, 0.9 * ref.objective, 0.99 * ref.objective, ref.objective, 1.2 * ref.objective):
        sol = solve(problem, method="priced", beaten=lambda bound, t=t: bound > t)
        if sol.status == "beaten":
            stopped += 1
            assert not sol.choice and t < sol.bound <= ref.objective * (1 + 1e-9)
        else:
            assert (sol.choice, sol.checkpointed, sol.objective) == (ref.choice, ref.checkpointed, ref.objective)
    assert stopped >= 1  # at 0.5 x its bound, the first proven bound is already beaten
