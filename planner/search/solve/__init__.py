"""Solvers: `Problem` -> `Solution` (fastest step under a per-rank memory budget).

    from planner.search.solve import solve, evaluate
    sol = solve(problem)                      # method="auto": two-level for large repeated-block problems
    time_s, peak_bytes, breakdown = evaluate(problem, sol.choice, sol.checkpointed)

`solve` runs the flat ILP (`planner.search.solve.ilp`), the priced search with a column ILP for many identical
blocks (`planner.search.solve.columns`), or the exact two-level solve (`planner.search.solve.two_level`), and always reports the objective and peak recomputed from the formulas (`planner.search.solve.evaluate`).
`brute_force` is the exhaustive reference used by the tests.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import time
from collections.abc import Callable

from planner.search.solve.brute_force import brute_force
from planner.search.solve.columns import GAP_TOLERANCE, LEAST_MODES, PricedSolve
from planner.search.solve.decompose import Decomposition, NotDecomposable, decompose
from planner.search.solve.driver import solve_built
from planner.search.solve.evaluate import evaluate, held_peak
from planner.search.solve.flat_start import priced_starts
from planner.search.solve.frontier import FrontierTooLarge
from planner.search.solve.ilp import build_flat, flat_size
from planner.search.solve.indexed import IndexedProblem, ProblemError, fold_fixed_edges, fold_shared_inputs
from planner.search.solve.milp import Progress, SolverError, resolve_solver
from planner.search.solve.min_budget import SolveMemo
from planner.search.solve.problem import (
    NOT_PROVEN,
    Block,
    Choice,
    Problem,
    ProblemEdge,
    ProblemNode,
    SharedInput,
    Solution,
)
from planner.search.solve.refine import (
    EXACT_FLAT_PAIRS,
    EXACT_GAP,
    EXACT_WORK,
    FIT_ROUNDS,
    PROVE_WORK,
    RETRY_SHRINK,
    RETRY_WORK_SHARE,
    as_given,
    refine_answer,
    worth_refining,
)
from planner.search.solve.two_level import TwoLevel

__all__ = [
    "AUTO_FLAT_LIMIT", "EXACT_FLAT_PAIRS", "EXACT_GAP", "EXACT_WORK", "FIT_ROUNDS", "METHODS", "PROGRESS_DELAY_S",
    "PROVE_WORK", "RETRY_SHRINK", "Block", "Choice", "FrontierTooLarge", "NotDecomposable", "Problem", "ProblemEdge",
    "ProblemError", "ProblemNode", "SharedInput", "Solution", "SolverError", "brute_force", "evaluate", "fastest_bound",
    "solve",
]

log = logging.getLogger(__name__)

METHODS = ("auto", "flat", "priced", "two_level")
# method="auto" uses the priced solve when the flat ILP would have more integer variables than this and
# the blocks decompose: symmetric copies of a block slow the flat ILP's branch and bound down already at a
# few dozen binaries (e.g. 2 s against 0.2 s for 2 blocks x 6 ops x 4 choices), and a 2-layer GPT on a
# 2x2x2 mesh (574 binaries) takes the flat ILP 30 s against 0.3 s priced (0.6% slower plan).
AUTO_FLAT_LIMIT = 50
# progress=True shows a line only for solves longer than this (seconds)
PROGRESS_DELAY_S = 1.0


def _pick_method(ip: IndexedProblem) -> tuple[str, Decomposition | None]:
    if flat_size(ip) <= AUTO_FLAT_LIMIT:
        return "flat", None
    try:
        dec = decompose(ip)
    except NotDecomposable as err:
        log.info("two-level solve not applicable (%s); using the flat ILP", err)
        return "flat", None
    return "priced", dec


def _flat_starts(ip: IndexedProblem) -> dict[str, tuple[list[int], list[int]] | None]:
    """MIP starts for a flat ILP too large to solve quickly (see `flat_start`), as `solve_built` takes them:
    the fastest assignment that fits and the least-memory one (none for small ILPs)."""
    if flat_size(ip) <= AUTO_FLAT_LIMIT:
        return {}
    found = priced_starts(ip)
    return {key: None if s is None else (s.choice, s.ckpt)
            for key, s in (("initial", found.fastest), ("least_initial", found.least))}


def solve(problem: Problem, *, budget: int | None = None, solver: str = "highs", time_limit: float | None = None,
          method: str = "auto", progress: bool = False, account: Callable[[Solution], int] | None = None,
          loosen: int = 0, beaten: Callable[[float], bool] | None = None, memo: SolveMemo | None = None,
          step_problem: Problem | None = None, step_binds: Callable[[Solution], bool] | None = None,
          step_memo: SolveMemo | None = None, least: str | None = None, prove: bool = False,
          known: Solution | None = None, held: bool = False, judge: Callable[[Solution], int] | None = None,
          refine: bool = True, certify: bool = True) -> Solution:
    """The fastest assignment (one choice per node, checkpointed blocks) whose peak fits the budget.

    budget: per-rank bytes the answer must fit (default: `problem.budget_bytes`); the problem is not
        changed, so one built problem serves every budget.
    solver: "highs" (falls back to "cbc" with a warning when highspy is missing) or "cbc".
    time_limit: None (default): every limit is counted in work (branch-and-bound nodes, solver
        checkpoints, prices, rounds), so the answer is a function of the problem alone and the same on
        a busy machine as on a quiet one.
        Seconds: the solve (all its rounds) also stops there, returning the best assignment found so far
        with status "feasible", its gap and a message saying so (or status "error" if none was found); the
        answer then depends on the machine's speed.
    method: "flat" (exact), "priced" (fast, for many identical blocks: a priced search and a column ILP,
        then where the gap is over 1 % the column ILP again with the minimisers of prices that pin one node
        to one group of its options (`pinned`) and the blocks one piece away from the answer's
        (`piece_swaps`); status "optimal" only when its gap to a Lagrangian lower bound closes,
        otherwise "feasible" with that gap), "two_level" (exact; both raise NotDecomposable when the blocks
        do not have one input and one output node each) or "auto" (flat for small problems, priced for
        decomposable ones, its answer handed to the flat ILP as a start where that is small and the gap over
        1 %, EXACT_FLAT_PAIRS, before the piece swaps).
    progress: show a spinner on stderr for solves that last more than a second.
    account: the bytes an answer really takes, where more is counted than the problem's formulas see
        (`plan_mesh` passes the assembled plan's bound); default: the answer's exact peak under the
        formulas. An answer over the budget by this account (bytes the formulas do not see, or the
        solver's feasibility tolerance hiding a few bytes on its memory row) is solved again under a
        budget tightened by at least the excess: the planner's one tighten-and-retry loop.
    loosen: bytes by which the first round's budget exceeds `budget`, where the formulas are known to
        count more than `account` (a checkpointed block's recompute peak is an upper bound there). The
        rounds end once tightening has used the loosening up (a solve without it is the caller's).
        Negative: the first round is tightened by that much, where the account is known to count more
        than the formulas (`narrow_least`). With an account, an answer that no round fits comes back
        "infeasible" without an assignment.
    beaten: beaten(bound) says whether an answer found elsewhere (another mesh's plan) is faster than
        `bound` seconds. The priced search stops as soon as its lower bound is beaten, with status "beaten"
        and no assignment: its answer would have been slower than that one anyway, so a caller that keeps
        the fastest answer keeps the same one, whenever the other answer arrived.
    memo: a `SolveMemo` of `problem` that earlier solves of it filled (what they found that does not
        depend on the budget: the priced search's least-memory answer), shared by this solve's rounds;
        a caller solving one problem at several budgets passes the same one to each (`plan_mesh`).

    least: where the priced search finds nothing that fits, the least-memory search runs "always" (the
        default without an account: the answer is then the least-memory assignment), "unproven" (the
        default with one: `plan_mesh` asks for the least budget itself at budget 0, so a least-memory answer
        of this budget's view is thrown away unless it fits, which only an unproven search leaves possible;
        GPT-3 175B on 64 ranks, 4x4x4 at its smallest budget: 5.9 s of 16) or "never" (`narrow_least`,
        below the least-memory plan's bound: that answer is the one known not to fit).
    step_problem: `problem` with the optimizer step counted in its memory row too (on the safe side: beside
        the saved activations, where the step holds none), and step_binds(answer): whether the optimizer
        step is what the account finds the answer does not fit. `problem`, whose row is the backward's
        alone, is solved first (its optimum is a lower bound of the true one); once an answer does not fit
        because of its step, the rounds go on with `step_problem`, whose answers fit the step. Only the
        rounds of `problem` give the answer's lower bound (`step_problem` is a restriction). step_memo: the
        `SolveMemo` of `step_problem`, as `memo` is of `problem`.
    held: the proofs of a priced answer (`fixing.prove`) count the gradients held beside each op from the start
        (`Problem.held_beside`; by default only once an answer without them was refused): their bounds hold for
        the plan's accounting, not for the formulas alone (`meshes._once_bound`). Without an account, a refinement's
        answer fits by the peak those proofs count (`evaluate.held_peak`), not the formulas' (HF Qwen2, 64 ranks,
        1.25x its smallest budget: the held ILP's 3.7138 ms, 4,096 B over by the formulas, fits the plan).
    judge: the bytes a refinement's answer takes (the flat ILPs from the priced answer, the pins and piece swaps),
        where it is not `account`: the plan's accounting for a solve whose rounds keep the formulas' peak
        (`meshes._once_bound`), so that a proof's answer the plan refuses is proven again under a tightened
        budget (`refine._fixed`) instead of ending the search. Default: `account`, or with `held` and no account
        the peak the held proofs count.
    known: an answer of `problem` known to fit `budget` by the account (the caller's plan at a tighter budget:
        `use_room`). The answer returned is never slower: the flat ILP starts from it, and a priced answer's
        refinement takes it where it is faster and searches only for answers faster than it.
    refine: False: the answer a round's search found, without its refinement (`refine.refine_answer`: the bound
        search, the flat ILPs from it, the piece swaps), and its search kept in `memo` as unrefined
        (`SolveMemo.keep_last`), so that a solve at the same budget refines it without searching again. For a caller
        that wants an answer's peak, not its speed (`narrow_least`, looking for a smaller budget: HF GPT-2 on 8
        ranks, 18 s of its 26 s smallest-budget search were proofs of answers too big for the budget of 1 B).

    certify: an answer proven optimal for the formulas only is proven again counting the held rows
        (`refine._held_certified`), which count no more than the plan's accounting. False for the problem counting
        saved tensors apart (`meshes._PlanAccount`), whose proofs are not taken as the plan's: `meshes._once_bound`
        proves that answer counting once (HF GPT-NeoX, 64 ranks, 1.5x its smallest budget:
        a certification there found the same faster answer, unproven as the plan counts, and `use_room` re-solved
        for 5 s).

    A round's lower bound holds for every later round (their budgets are tighter), so the answer's bound is
    the best of all rounds; the priced search's most expensive bound (by ranges of max-term levels) runs
    once, for the answer returned, and only where the answer is still more than 5 % above that bound.

    An infeasible budget gives status "infeasible" with `min_feasible_budget` (the least peak; `message`
    says when the time limit left it unproven) and the least-memory assignment in `choice`,
    `checkpointed` and `peak_bytes`.
    """
    if method not in METHODS:
        raise SolverError(f"unknown method {method!r}; use one of {METHODS}")
    if least is not None and least not in LEAST_MODES:
        raise SolverError(f"least must be one of {LEAST_MODES}, got {least!r}")
    if time_limit is not None and not time_limit > 0:
        raise SolverError(f"time_limit must be > 0 seconds, got {time_limit}")
    name = resolve_solver(solver)
    start = time.perf_counter()
    deadline = float("inf") if time_limit is None else start + time_limit
    budget = int(problem.budget_bytes if budget is None else budget)
    measure = account if account is not None else (lambda s: s.peak_bytes)
    # what a refinement's answer is measured by: without an account, in a solve counting held rows, the peak the
    # ILPs count (the rounds, whose tightenings assume the formulas' peak, keep theirs)
    refined = judge or (_held_measure(problem, budget) if held and account is None else measure)
    if memo is None or memo.problem is not problem:
        memo = SolveMemo(problem)
    memo.last = None  # (an earlier solve's last search was refined: never kept)
    shrink = -int(loosen)
    proven = -math.inf  # the best lower bound of the rounds so far (they hold for every tighter budget)
    at_budget = -math.inf  # ... of the rounds at the budget or above it: the bound that holds for `budget`
    lift: Callable[..., Solution | None] | None = None
    # the last round at the budget or above it, whose answer the account refused, and what is left of its refinement:
    # its proofs hold at the budget, a tightened round's only at its own
    at_budget_round: tuple[Solution, Callable[..., Solution | None]] | None = None
    restricted = False  # solving step_problem: its bounds are not the true problem's
    for _ in range(FIT_ROUNDS):
        if beaten is not None and beaten(proven):
            memo.keep_last()  # the last round's search, whose answer was refused: a later solve at its budget may use it
            return Solution.beaten_by_elsewhere(proven, time.perf_counter() - start)
        memo.last = None
        sol, lift = _solve_at(problem, budget - shrink, name, deadline, method, progress, memo, beaten,
                              least=least or ("always" if account is None else "unproven"), prove=prove, known=known,
                              held=held, certify=certify)
        if sol.status == "beaten":
            lift = None
            break
        if math.isfinite(sol.bound) and not restricted:
            proven = max(proven, sol.bound)
            if shrink <= 0:
                at_budget = max(at_budget, sol.bound)
        if sol.status in ("optimal", "feasible"):
            used = measure(sol)
            if used <= budget:
                break
            if shrink <= 0 and lift is not None and not restricted:
                at_budget_round = sol, lift
            if step_problem is not None and not restricted and step_binds is not None and step_binds(sol):
                # The optimizer step is what does not fit: solve the problem that counts it, at the same budget.
                log.info("answer's optimizer step takes %d B against a budget of %d B; solving with the step "
                         "counted", used, budget)
                problem, restricted = step_problem, True
                memo = step_memo if step_memo is not None and step_memo.problem is step_problem else SolveMemo(problem)
                continue
            # Tighten so that the next answer, carrying what this one counts beyond the formulas, fits. The
            # answer need not have been at the round's budget (gpt3-175b on 4x4x4 at 160 GiB: 17 MB below
            # it, 0.1 MB more in the plan), so tightening by the excess alone can return the same answer
            # every round: by the excess, by what the account adds to the formulas, and at least doubling.
            grow = max(shrink + used - budget, used - sol.peak_bytes, 2 * shrink)
            log.info("answer takes %d B against a budget of %d B; tightening the solver's budget by %d B",
                     used, budget, grow)
            shrink = grow
            # Also once a loosening is spent: a round at or below the budget is what a solve without it does
            # (the caller's: `use_room` keeps its plan, `plan_mesh` its least-memory plan). HF BERT, 8 ranks,
            # 1.25x its smallest budget: use_room 9.2 -> 5.0 s, same plan.
            if budget - shrink < 0 or (loosen > 0 and shrink >= 0):
                sol, lift = _unfit(problem, budget, shrink, account, name, deadline, method, progress, memo), None
                break
        else:
            break
    else:
        sol, lift = _unfit(problem, budget, shrink, account, name, deadline, method, progress, memo), None
    if not refine:
        lift, at_budget_round = None, None
        memo.keep_last()
    if sol.status in ("optimal", "feasible"):
        sol.raise_bound(proven, GAP_TOLERANCE)
        if lift is not None and (shrink <= 0 or at_budget_round is None or restricted):
            # the flat ILP's answer from the priced one, where that is small (method "auto"), is kept where
            # the account fits it too: once per solve, for its answer, not for every round's (a tightened round's
            # answer is refined at the budget instead, below)
            better = lift(sol, lambda s: refined(s) - budget, at=budget)
            if better is not None and better is not sol and refined(better) <= budget:
                sol = better
        if shrink > 0 and not restricted:
            # a tightened round's bounds (its own, and its refinements' proofs) hold for its budget only: an answer
            # the plan fits may lie between (hf-gpt2, 8 ranks, 2x its smallest budget: 0.4519 ms proven at the
            # budget tightened by 64 KiB, where 0.4485 ms fits the plan); the answer's is what the rounds at the
            # budget proved
            _rebound(sol, at_budget, _AT_BUDGET)
            if at_budget_round is not None and worth_refining(sol, beaten):
                # ... and the refinement of the last round at the budget, from this answer (`refine._faster_known`: the
                # account refused that round's answer), proves at the budget: the flat ILPs over what can beat it
                # count the held rows, and where their answer does not fit, run again tightened (`refine._fixed`)
                first, refine_first = at_budget_round
                lift_from = sol  # (the tightened round's answer, unrefined)
                better = refine_first(first, lambda s: refined(s) - budget, known=sol, held=True, at=budget)
                if better is not None and better is not first and refined(better) <= budget:
                    better.raise_bound(at_budget, GAP_TOLERANCE)
                    sol = better
                if lift is not None and worth_refining(sol, beaten):
                    # still unproven: the tightened round's refinement may find a faster answer (hf-gpt2, 8 ranks, at
                    # its smallest budget: 1.2073 -> 1.1801 ms); its bounds hold for its budget only: not taken
                    faster = lift(lift_from, lambda s: refined(s) - budget, known=sol, at=budget,
                                  share=RETRY_WORK_SHARE)
                    if (faster is not None and faster.choice and faster.objective < sol.objective
                            and refined(faster) <= budget):
                        _rebound(faster, sol.bound, _AT_BUDGET)
                        sol = faster
        if restricted:
            # step_problem's bounds (its rounds', and the lift's) hold for its restriction only: the answer's
            # is what the rounds of `problem` proved
            _rebound(sol, proven, "solved with the optimizer step counted beside the activations")
    if shrink > 0 and sol.status in ("optimal", "feasible"):
        sol.message = "; ".join(m for m in (sol.message, f"budget tightened by {shrink} B for what the "
                                                           "answer takes beyond the solver's model") if m)
    elif shrink < 0 and sol.status in ("optimal", "feasible"):
        sol.message = "; ".join(m for m in (sol.message, f"solved with the budget loosened by {-shrink} B, what "
                                                           "the solver's model counts beyond the plan's") if m)
    elif sol.status == "infeasible" and shrink > 0 and sol.choice and account is None:
        # a round tightened against solver tolerance found nothing: its least-memory assignment may fit
        least = copy.copy(sol)
        least.status, least.min_feasible_budget, least.gap = "feasible", None, float("nan")
        least.message = "the least-memory assignment (no faster one fits)"
        if measure(least) <= budget:
            sol = least
    sol.seconds = time.perf_counter() - start
    return sol


_AT_BUDGET = "the bound is that of the solve at the budget, before it was tightened"


def _rebound(sol: Solution, bound: float, why: str) -> None:
    """`sol` with `bound` (-inf: none) as its lower bound, in place of the one its own round proved, and `why`."""
    sol.bound, sol.gap, sol.status = float("nan"), float("nan"), "feasible"
    sol.plan_proven = sol.formulas_proven = False  # what its own round proved
    notes = [m for m in sol.message.split("; ") if m and m != NOT_PROVEN]
    sol.message = "; ".join([NOT_PROVEN, *notes, why])
    sol.raise_bound(bound, GAP_TOLERANCE)


def _held_measure(problem: Problem, budget: int) -> Callable[[Solution], int]:
    """An answer's peak as the flat ILP with held rows counts it (the formulas' where the problem has no rows)."""
    ip = IndexedProblem(problem, budget)
    if not ip.has_held:
        return lambda s: s.peak_bytes
    return lambda s: held_peak(ip, *ip.vectors(s.choice, s.checkpointed))


def _unfit(problem: Problem, budget: int, shrink: int, account: Callable[[Solution], int] | None, name: str,
           deadline: float, method: str, progress: bool, memo: SolveMemo) -> Solution:
    """The answer when no round's answer fits: without an account, the least-memory assignment (status
    "infeasible", or "feasible" where it fits); with one, "infeasible" and no assignment: the caller knows
    what its account adds and searches for the least budget itself (`plan_mesh`)."""
    if account is None:
        return _solve_at(problem, 0, name, deadline, method, progress, memo)[0]
    return Solution(status="infeasible", message=(
        f"no answer fit the budget of {budget} B by the account after tightening the solver's budget by {shrink} B"))


def _solve_at(problem: Problem, budget: int, name: str, deadline: float, method: str, progress: bool,
              memo: SolveMemo, beaten: Callable[[float], bool] | None = None, least: str = "always",
              prove: bool = False, known: Solution | None = None, held: bool = False, certify: bool = True
              ) -> tuple[Solution, Callable[..., Solution | None] | None]:
    """One round of `solve`: the chosen method under `budget`, its figures those of the problem as given,
    and for a priced answer what is left for the answer `solve` keeps: the bound search (`PricedSolve.lift`)
    and, with method "auto", the flat ILP from it where that is small, then the pins and piece swaps (`refine.refine_answer`).
    `least`: when the priced search finds nothing that fits, whether it searches the least-memory answer
    (`PricedSolve.solve`); `known`, `held`, `certify`: `solve`'s."""
    exact = IndexedProblem(problem, budget)
    ip = copy.copy(exact)  # the solvers' view: folding replaces list entries, so the lists are copied
    ip.time, ip.recompute, ip.transient, ip.edges = (list(exact.time), list(exact.recompute),
                                                      list(exact.transient), list(exact.edges))
    ip.transient_unckpt = list(exact.transient_unckpt)
    ip.saved, ip.shared = list(exact.saved), list(exact.shared)
    fold_fixed_edges(ip)
    fold_shared_inputs(ip)
    chosen, dec = _pick_method(ip) if method == "auto" else (method, None)
    with Progress(progress, f"planner: {chosen.replace('_', '-')} solve of {ip.n} nodes", PROGRESS_DELAY_S):
        sol, lift = None, None
        if chosen == "priced":
            try:
                search, sol = _priced_search(ip, dec, beaten, memo, name, deadline, least)
                lift = functools.partial(refine_answer, search, ip, exact, name, deadline, beaten, method == "auto",
                                         prove, known=known, held=held, certify=certify)
            except NotDecomposable as err:
                if method == "priced":
                    raise
                log.info("priced solve not applicable (%s); using the flat ILP", err)
        if chosen == "two_level":
            try:
                sol = TwoLevel(ip, dec).solve(name, deadline)
            except (NotDecomposable, FrontierTooLarge) as err:
                if method == "two_level":
                    raise
                log.info("two-level solve not applicable (%s); using the flat ILP", err)
        if sol is None:
            starts = _flat_starts(ip)
            if known is not None and known.choice and known.peak_bytes <= budget:
                starts["initial"] = ip.vectors(known.choice, known.checkpointed)
            sol = solve_built(ip, functools.partial(build_flat, ip), solver=name, deadline=deadline, method="flat",
                              **starts)
    return as_given(exact, sol), lift


def _priced_search(ip: IndexedProblem, dec: Decomposition | None, beaten: Callable[[float], bool] | None,
                   memo: SolveMemo, name: str, deadline: float, least: str) -> tuple[PricedSolve, Solution]:
    """The priced search of `ip` and its answer (`PricedSolve.solve`, unlifted), or those an earlier solve of the same
    problem kept in `memo` at this budget (`SolveMemo.keep_last`: a solve stopped right after the plan refused that
    answer, so neither was refined; each is used once). The search depends on nothing else where it found an
    answer (`least` only acts where none fits) and neither a time limit nor `beaten` cut it short; `beaten` acts on
    it as on a new search: its bound only rises as it runs, so where its final bound is not beaten, no bound of
    the search was. (HF BERT, 64 ranks, 2x its smallest budget: `plan_mesh`'s first solve, whose answer the plan
    refuses for a tensor counted once, and `_once_bound`'s from the answer counted apart: 1.4 s each.)"""
    key = (name, ip.budget)
    kept = memo.priced.pop(key, None) if math.isinf(deadline) else None
    if kept is not None:
        search, sol = kept
        search.beaten = beaten
        if beaten is not None and beaten(search.best_bound):
            search.dominated = True
            return search, search._beaten(time.perf_counter())
        return search, sol
    search = PricedSolve(ip, dec or decompose(ip), beaten, memo)
    sol = search.solve(name, deadline, lift=False, least=least)
    if sol.status in ("optimal", "feasible") and not (search.stopped or search.dominated) and math.isinf(deadline):
        memo.last = (key, search, copy.copy(sol))  # (as found: the rounds change the answer they return)
    return search, sol


_NO_BUDGET = 1 << 50  # a per-rank budget (1 PiB) every assignment fits: `fastest_bound`


def fastest_bound(problem: Problem, solver: str = "highs") -> float:
    """A lower bound on the time of every assignment, whatever memory it takes: the fastest assignment's (solved
    without a budget to speak of; -inf where that solve proves nothing). The bound a least-memory plan reports:
    the plan's accounting fits it where the formulas do not, so their bounds do not hold for it, and no other
    is known (GPT-3 175B on 8 ranks at its smallest budget)."""
    fastest = solve(problem, budget=_NO_BUDGET, solver=solver, certify=False)  # (no budget: nothing to certify)
    return fastest.bound if fastest.status == "optimal" and math.isfinite(fastest.bound) else -math.inf
