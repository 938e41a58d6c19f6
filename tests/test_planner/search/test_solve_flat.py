"""The flat ILP against brute force on random small problems, budgets at the byte boundary, pairs of choices
ruled out, and its size reductions (single-choice nodes and splittable edge matrices need no variables)."""

import functools

import numpy as np
import pytest
from synthetic_problems import every_assignment, random_problem

from planner.search.solve import Choice, Problem, ProblemEdge, ProblemNode, brute_force, evaluate, solve
from planner.search.solve.driver import solve_built
from planner.search.solve.ilp import build_flat, flat_size
from planner.search.solve.indexed import IndexedProblem

SEEDS = range(30)


def _instance(seed: int) -> Problem:
    """<= 8 nodes, <= 4 choices, random edges/matrices, 1-2 random blocks, checkpointing off for every 5th."""
    rng = np.random.default_rng(1000 + seed)
    return random_problem(
        rng, n_nodes=int(rng.integers(3, 9)), max_choices=4, edge_prob=float(rng.uniform(0.2, 0.6)),
        n_blocks=int(rng.integers(1, 3)), checkpointing=seed % 5 != 0, budget_fraction=float(rng.uniform(0.45, 0.85)),
    )


def test_random_problems_match_brute_force() -> None:
    seen = {"optimal": 0, "infeasible": 0, "checkpointed": 0}
    for seed in SEEDS:
        problem = _instance(seed)
        ref = brute_force(problem)
        sol = solve(problem, method="flat")
        assert sol.status == ref.status, seed
        assert sol.method == "flat"
        seen[ref.status] += 1
        if ref.status == "optimal":
            assert sol.objective == pytest.approx(ref.objective, rel=1e-9, abs=0), seed
            assert sol.peak_bytes <= problem.budget_bytes
            assert evaluate(problem, sol.choice, sol.checkpointed)[:2] == (sol.objective, sol.peak_bytes)
            seen["checkpointed"] += bool(ref.checkpointed)
        else:
            assert sol.min_feasible_budget == ref.min_feasible_budget, seed
            assert sol.peak_bytes == ref.min_feasible_budget
    # the instances exercise both outcomes (checkpointing rarely pays here: a checkpointed block's recompute
    # peak counts its activations beside its largest working set, and these blocks are 1-3 nodes with
    # transients as large as activations; tests/test_planner/search/test_solve_evaluate.py and the two-level mixing test cover it)
    assert seen["optimal"] >= 15 and seen["infeasible"] >= 8, seen


def _giant_bytes(seed: int) -> Problem:
    """A random problem with every byte count multiplied by ~2^33 + odd noise (tens of GiB, not round)."""
    problem = _instance(seed)
    scale = 8_589_934_597
    for node in problem.nodes:
        node.choices = [Choice(c.time_s, c.recompute_s, c.state_bytes * scale + 7, c.saved_bytes * scale + 3,
                               c.transient_bytes * scale + 1) for c in node.choices]
    for block in problem.blocks:
        block.input_bytes = [b * scale + 5 for b in block.input_bytes]
    return problem


@pytest.mark.parametrize("seed", [1, 3, 7])
def test_budget_at_the_exact_byte_boundary(seed: int) -> None:
    problem = _giant_bytes(seed)
    problem.budget_bytes = 0
    least = brute_force(problem).min_feasible_budget
    assert least is not None and least > 10**11
    sol = solve(problem, method="flat")
    assert sol.status == "infeasible" and sol.min_feasible_budget == least
    problem.budget_bytes = least  # fits exactly
    sol = solve(problem, method="flat")
    assert sol.status == "optimal" and sol.peak_bytes == least
    assert sol.objective == pytest.approx(brute_force(problem).objective, rel=1e-9)
    problem.budget_bytes = least - 1  # one byte short
    sol = solve(problem, method="flat")
    assert sol.status == "infeasible" and sol.min_feasible_budget == least


def test_single_choice_nodes_are_constants() -> None:
    rng = np.random.default_rng(5)
    problem = random_problem(rng, n_nodes=6, max_choices=1, n_blocks=1, checkpointing=False, budget_fraction=2.0)
    ip = IndexedProblem(problem)
    assert flat_size(ip) == 0
    built = build_flat(ip, "time", ip.budget)
    assert built.model.num_vars == 1  # only the max-term variable T
    sol = solve(problem)
    assert sol.status == "optimal"
    assert sol.objective == pytest.approx(evaluate(problem, {n.name: 0 for n in problem.nodes})[0], rel=1e-12)


def _two_nodes(matrix: np.ndarray) -> Problem:
    nodes = [ProblemNode(name, [Choice(0.1 * (i + 1), 0.0, 10 * i, 0, 0) for i in range(3)]) for name in "uv"]
    return Problem(nodes, [ProblemEdge("u", "v", matrix, np.zeros((3, 3)))], [], 10**6, checkpointing=False)


def test_splittable_edge_matrices_need_no_pair_variables() -> None:
    base = build_flat(IndexedProblem(_two_nodes(np.zeros((3, 3)))), "time", 10**6).model.num_vars
    a, b = np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.0, 4.0])
    for matrix in (np.full((3, 3), 0.7), a[:, None] + b[None, :]):
        ip = IndexedProblem(_two_nodes(matrix))
        assert build_flat(ip, "time", 10**6).model.num_vars == base
        assert solve(_two_nodes(matrix)).objective == pytest.approx(brute_force(_two_nodes(matrix)).objective)
    mixed = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    assert build_flat(IndexedProblem(_two_nodes(mixed)), "time", 10**6).model.num_vars == base + 9
    assert solve(_two_nodes(mixed)).objective == pytest.approx(brute_force(_two_nodes(mixed)).objective)


def test_ruled_out_pairs_are_never_taken() -> None:
    """`build_flat(allowed=)`: with pairs of choices ruled out on some edges (reduced-cost fixing of pairs), the
    ILP's optimum is brute force's over the assignments that take none of them, checkpointed or not."""
    checked = 0
    for seed in SEEDS:
        problem = _instance(seed)
        ip = IndexedProblem(problem)
        rng = np.random.default_rng(seed)
        allowed = {k: rng.random((ip.sizes[e.src], ip.sizes[e.dst])) < 0.6 for k, e in enumerate(ip.edges)
                   if ip.sizes[e.src] > 1 and ip.sizes[e.dst] > 1}

        def takes_none(choice: list[int], ip: IndexedProblem = ip, allowed: dict = allowed) -> bool:
            return all(mask[choice[ip.edges[k].src], choice[ip.edges[k].dst]] for k, mask in allowed.items())

        fitting = [(time_s, choice) for choice, ckpt, time_s, peak, _ in every_assignment(ip)
                   if peak <= ip.budget and (ip.checkpointing or not ckpt) and takes_none(choice)]
        if not fitting or not allowed:
            continue
        sol = solve_built(ip, functools.partial(build_flat, ip, allowed=allowed), solver="highs",
                          deadline=float("inf"), method="flat")
        assert sol.status == "optimal", seed
        assert sol.objective == pytest.approx(min(fitting)[0], rel=1e-9), seed
        assert takes_none([sol.choice[n] for n in ip.names])
        checked += 1
    assert checked >= 8
