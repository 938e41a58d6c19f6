"""evaluate(): the formulas of planner.search.solve.problem on a hand-computed example, and its input checks."""

import numpy as np
import pytest

from planner.search.solve import (
    Block,
    Choice,
    Problem,
    ProblemEdge,
    ProblemError,
    ProblemNode,
    brute_force,
    evaluate,
    solve,
)


def _example(budget: int = 2100) -> Problem:
    """a -> [b -> c] -> d with block B = {b, c} fed by a."""
    nodes = [
        ProblemNode("a", [Choice(1.0, 0.5, 1000, 200, 50), Choice(2.0, 1.0, 500, 100, 300)]),
        ProblemNode("b", [Choice(0.5, 0.2, 10, 400, 20), Choice(0.7, 0.3, 20, 600, 10)], block="B"),
        ProblemNode("c", [Choice(0.1, 0.05, 0, 80, 100)], block="B"),
        ProblemNode("d", [Choice(0.2, 0.1, 5, 30, 0), Choice(0.1, 0.1, 50, 30, 0)]),
    ]
    edges = [
        ProblemEdge("a", "b", np.array([[0.0, 0.5], [0.25, 0.0]]), np.array([[0.0, 0.1], [0.2, 0.0]])),
        ProblemEdge("b", "c", np.array([[0.01], [0.02]]), np.array([[0.001], [0.002]])),
        ProblemEdge("c", "d", np.array([[0.0, 0.3]]), np.zeros((1, 2))),
    ]
    return Problem(nodes, edges, [Block("B", ["b", "c"], "a", [150, 40])], budget)


def test_plain_assignment_by_hand() -> None:
    time_s, peak, parts = evaluate(_example(), {"a": 0, "b": 1, "c": 0, "d": 1})
    assert time_s == pytest.approx(1.0 + 0.7 + 0.1 + 0.1 + 0.5 + 0.02 + 0.3, rel=1e-12)
    assert peak == 1070 + 910 + 100  # states + all saved + largest transient (c)
    assert (parts["state_bytes"], parts["saved_bytes"], parts["kept_input_bytes"], parts["transient_bytes"]) == (
        1070, 910, 0, 100)
    assert parts["recompute_s"] == 0.0


def test_checkpointed_block_by_hand() -> None:
    time_s, peak, parts = evaluate(_example(), {"a": 0, "b": 1, "c": 0, "d": 1}, ["B"])
    # recompute: b 0.3 + c 0.05 + edge a->b 0.1 + edge b->c 0.002 (edges into or inside B)
    assert parts["recompute_s"] == pytest.approx(0.452, rel=1e-12)
    assert time_s == pytest.approx(2.72 + 0.452, rel=1e-12)
    # saved only for a and d; B keeps input_bytes[choice of a]; its recompute peak: the recomputed 600 + 80
    # beside its largest working set, transient 100
    assert (parts["saved_bytes"], parts["kept_input_bytes"], parts["recomputed_bytes"]) == (230, 150, 780)
    assert peak == 1070 + 230 + 150 + 780


def test_recompute_peak_counts_what_is_recomputed_up_to_each_node() -> None:
    """At b's backward only b's activations are recomputed: b's large working set sits beside b's 400, not
    beside c's 80 too (c's backward, with both, has the smaller working set)."""
    problem = _example()
    problem.nodes[1].choices[0] = Choice(0.5, 0.2, 10, 400, 500)  # b: working set 500
    parts = evaluate(problem, {"a": 0, "b": 0, "c": 0, "d": 1}, ["B"])[2]
    assert parts["recomputed_bytes"] == max(400 + 500, 400 + 80 + 100) == 900


@pytest.mark.parametrize(
    ("budget", "status", "ckpt"),
    [(1264, "infeasible", None), (1265, "optimal", ["B"]), (1400, "optimal", ["B"]), (1425, "optimal", []),
     (2000, "optimal", [])],
)
def test_solve_agrees_with_brute_force_on_the_example(budget: int, status: str, ckpt: list | None) -> None:
    problem = _example(budget)
    ref, sol = brute_force(problem), solve(problem)
    assert sol.status == ref.status == status
    if status == "optimal":
        assert sol.objective == pytest.approx(ref.objective, rel=1e-9)
        assert sol.checkpointed == ckpt
        assert sol.peak_bytes <= budget
        assert evaluate(problem, sol.choice, sol.checkpointed)[:2] == (sol.objective, sol.peak_bytes)
    else:
        assert sol.min_feasible_budget == ref.min_feasible_budget == 1265
        assert sol.peak_bytes == 1265  # the least-memory assignment is reported


@pytest.mark.parametrize(
    ("choice", "ckpt", "words"),
    [
        ({"a": 0, "b": 0, "c": 0}, [], "no entry for nodes ['d']"),
        ({"a": 0, "b": 2, "c": 0, "d": 0}, [], "out of range"),
        ({"a": 0, "b": 0, "c": 0, "d": 0, "zz": 1}, [], "unknown nodes"),
        ({"a": 0, "b": 0, "c": 0, "d": 0}, ["nope"], "unknown block"),
    ],
)
def test_evaluate_rejects_bad_assignments(choice: dict, ckpt: list, words: str) -> None:
    with pytest.raises(ProblemError, match=words.replace("[", r"\[").replace("]", r"\]")):
        evaluate(_example(), choice, ckpt)


def test_evaluate_rejects_checkpoints_when_disabled() -> None:
    problem = _example()
    problem.checkpointing = False
    with pytest.raises(ProblemError, match="checkpointing is False"):
        evaluate(problem, {"a": 0, "b": 0, "c": 0, "d": 0}, ["B"])


def _bad(kind: str) -> Problem:
    p = _example()
    if kind == "edge_node":
        p.edges.append(ProblemEdge("a", "x", np.zeros((2, 1)), np.zeros((2, 1))))
    elif kind == "edge_shape":
        p.edges[0].cost_s = np.zeros((2, 3))
    elif kind == "two_blocks":
        p.blocks.append(Block("C", ["c"], "b", [1, 1]))
    elif kind == "input_bytes":
        p.blocks[0].input_bytes = [1, 2, 3]
    elif kind == "negative":
        p.nodes[0].choices[0] = Choice(1.0, 0.5, -1, 0, 0)
    elif kind == "nan":
        p.edges[1].recompute_s = np.array([[np.nan], [0.0]])
    elif kind == "block_field":
        p.nodes[3].block = "B"
    elif kind == "duplicate":
        p.nodes.append(ProblemNode("a", [Choice(0, 0, 0, 0, 0)]))
    elif kind == "self_loop":
        p.edges.append(ProblemEdge("a", "a", np.zeros((2, 2)), np.zeros((2, 2))))
    return p


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("edge_node", "not in problem.nodes"), ("edge_shape", "expected \\(2, 2\\)"), ("two_blocks", "at most one block"),
        ("input_bytes", "input_bytes has 3 entries"), ("negative", "negative bytes"), ("nan", "NaN"),
        ("block_field", "make ProblemNode.block agree"), ("duplicate", "appears twice"), ("self_loop", "self-loop"),
    ],
)
def test_malformed_problems_raise_problem_error(kind: str, words: str) -> None:
    with pytest.raises(ProblemError, match=words):
        solve(_bad(kind))


def test_fast_evaluator_gives_evaluate_indexeds_exact_figures() -> None:
    """The priced search's vectorised evaluation equals the reference formulas bit for bit (same floats,
    same bytes), on random assignments and checkpoint sets of random problems."""
    import numpy as np
    from synthetic_problems import random_problem

    from planner.search.solve.evaluate import FastEvaluator, evaluate_indexed
    from planner.search.solve.indexed import IndexedProblem

    rng = np.random.default_rng(0)
    for _ in range(20):
        problem = random_problem(rng, n_nodes=12, n_blocks=3)
        for e in problem.edges[::2]:  # conversions with a working set, as the planner's problems have
            e.transient_bytes = rng.integers(0, 900, size=e.cost_s.shape)
        ip = IndexedProblem(problem)
        fast = FastEvaluator(ip)
        for _ in range(10):
            choice = [int(rng.integers(s)) for s in ip.sizes]
            blocks = [b for b in range(len(ip.block_nodes)) if rng.random() < 0.5]
            time_s, peak, _ = evaluate_indexed(ip, choice, blocks)
            assert fast(choice, blocks) == (time_s, peak)
