"""What `solve` does with the answer it keeps of a priced round: its bound lifted, the flat ILP from it where that
is small, the flat ILPs over the options that can beat it (`fixing.prove`; counting the gradients held beside each
op where the caller's account refused an answer, and again under a tightened budget where it refuses theirs), the
pinned prices' columns and the blocks one piece away (`PricedSolve.improve`). Each step's answer is taken only where
the caller's account fits it, and each bound only where it holds at the caller's budget.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable

from planner.search.solve import fixing
from planner.search.solve.block_dp import Price
from planner.search.solve.columns import GAP_TOLERANCE, PricedSolve
from planner.search.solve.driver import solve_built
from planner.search.solve.evaluate import evaluate_indexed, held_peak
from planner.search.solve.ilp import build_flat, flat_pairs
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.milp import WORK_LIMIT, resolve_solver, solve_milp
from planner.search.solve.problem import NOT_PROVEN, Problem, Solution, relative_gap

__all__ = ["CERTIFY_SHARE", "CERTIFY_WORK", "EXACT_FLAT_PAIRS", "EXACT_FLAT_PAIRS_MANY", "EXACT_GAP", "EXACT_WORK", "FIT_ROUNDS",
           "HELD_BOUND", "PROVE_WORK", "RETRY_SHRINK", "RETRY_WORK_SHARE", "as_given", "held_exact", "refine_answer", "worth_refining"]

# With method "auto", a priced answer not proven within EXACT_GAP of optimal is handed to the flat ILP (exact,
# work-limited) as its start where that ILP is small (`flat_pairs` at most EXACT_FLAT_PAIRS): the built-in mlp on 2x2x2 at 4x
# its smallest budget, priced 0.0893 ms with a 36 % gap, becomes the optimum 0.0859 ms (gap 22 %); HF BERT's
# (8,) mesh and gpt-tiny's 8x8 qualify, the tiny HF models' 2x2x2 (15-18k; 5-9 s each) do not.
EXACT_GAP = 0.01
EXACT_FLAT_PAIRS = 8_000
EXACT_WORK = 500_000  # ... with an eighth of the flat ILP's usual work (milp.WORK_LIMIT): a start it cannot
# improve soon is kept (HF LLaMA's (8,) mesh at 1.25x, 20k nonzeros: 10 s at the usual work, 1.9 s now)
# On problems of more blocks than the proofs per set take (`fixing.applies`), nothing else proves a priced answer:
# there the flat ILP runs up to this size, with its usual work (gpt2-small on 8x8 at its smallest budget, 40k pairs:
# 59.5209 ms "2.09 %" -> the optimum 59.1252 ms in 7.1 s CPU; at an eighth of the work it only proved 0.7 %)
EXACT_FLAT_PAIRS_MANY = 50_000
# Where the problem has at most four blocks (`fixing.applies`), an answer not proven within EXACT_GAP is handed
# to reduced-cost fixing and the flat ILP over what can beat it (`fixing.prove`) with this much work, before
# the piece swaps (`PricedSolve.improve`, which then run only where it is still not proven within EXACT_GAP).
# With prove=True, again after the swaps without a work limit where still unproven (with that one alone, in place of
# the work-limited one first, HF LLaMA 64 ranks 4x4x4 at 2x its smallest budget came out 1.4798 ms, 20 % from its
# bound, where the default plan is 1.4460 ms proven: the swaps led elsewhere). Four times the flat ILP's usual work, per set of
# checkpointed blocks it solves (one ILP each, the set fixed): HF LLaMA (8 ranks, 1.5x) needs 6e6 to prove
# its answer (2.8 s CPU; 4.9 s for the whole plan, which then skips the swaps), and stops at 4e6 with a 3.4 %
# gap (7.1 s); with one checkpoint binary per block (before) it took 20 s CPU to prove. The held ILP, with more
# nonzeros per option (the work is counted per nonzero), needs more: gpt-tiny on 4x4x4 at its smallest budget
# stopped at twice the usual work with 58 % (4.1 s) and "proved" 7.6999 ms optimal at four times (6.6 s; with the
# formulas' recompute rows, whose bound did not hold: `Problem.held_rerun`); with the rows counting the residual
# stream's gradient only where it is apart (`HeldBeside.apart`) it proves 7.5977 ms optimal (31 nodes, ~20 s).
PROVE_WORK = 4 * WORK_LIMIT
# the note of an answer proven optimal for the formulas only whose bound, as the plan counts, is the held rows'
HELD_BOUND = ("proven optimal for the solver's memory formulas only, which count some assignments above the plan's "
              "accounting: its lower bound is that of the flat ILP counting the held rows, which count no more than "
              "the plan")
# An answer proven optimal for the formulas only (`FORMULAS_ONLY`) on a problem `fixing.prove` takes is proven again
# counting the held rows (`_held_certified`), by default with this much work per ILP, over the ranges of levels where
# the formulas' bound search left an assignment that can beat it. On the tiny HF bench (60 cells, two workers): 14
# -> 45 proven as the plan counts, 8 faster plans (LLaMA 8 ranks 2x 0.1893 -> 0.1721 ms, +2 s), and the held rows'
# bound where the plan refuses their optimum (LLaMA 8 ranks 1.5x: 0.3951 ms, 3.14 % from 0.3827 ms, 5.3 -> 8.8 s);
# +15 % plan time in all. Over every level (where none was left) it takes longer than the plan: HF LLaMA 64 ranks 1x,
# 1,361 of 1,396 options kept, stopped at this work after 8.5 s, 41 % from its bound. 1.5x WORK_LIMIT: with the rows
# counting BERT's re-run intermediates, HF LLaMA 8 ranks 1.5x needed a few more than WORK_LIMIT's 73 checkpoints.
CERTIFY_WORK = 3 * WORK_LIMIT // 2
# ... and where that search left no range that can beat it, over every level (`_fixing_ranges`) where reduced-cost
# fixing keeps at most this share of the options (`fixing.kept_share`). On the tiny HF bench at their smallest budgets:
# LLaMA, Qwen2, GPT-NeoX, OPT on 8 ranks keep 10-14 % and are proven as the plan counts in 1.6-3.1 s (as long as
# before); BERT on 8 ranks keeps 88 % (+0.9 s to prove) and LLaMA on 64 ranks 90 % (+7 s): left to `prove=True`.
CERTIFY_SHARE = 0.5
# Where the caller's account does not fit the answer of that flat ILP, it runs again under the budget tightened by
# what the account counted beyond the ILP's own peak (`_fixed`), by at most this share of the budget. Below it the
# retries found the faster plans (HF BERT 64 ranks 1x: 0.02 %, 52.57 -> 51.45 ms; HF OPT 64 1.25x: 0.56 %,
# 3.2493 -> 3.2034 ms; gpt-tiny 64 ranks at its smallest budget: 1.02 %, 9.8133 -> 8.2741 ms, for 3 s CPU);
# above it none found anything (hf-gpt2 8 ranks 1.25x: 3.6 %, 4.9 s for nothing; `use_room`'s re-solves,
# tightened back by their whole loosening).
RETRY_SHRINK = 0.02
# ... each with this share of the proof's work: it looks for a faster answer that fits, and one it does not find soon
# it seldom finds (hf-gpt2, 8 ranks, at its smallest budget: 24.8 s to prove that none beats the plan's 1.2073 ms).
# So does `solve`'s refinement of a tightened round's answer (`refine_answer(share=)`), whose bounds are not taken
# (the same cell: 14.4 s for a held proof at the tightened budget whose answer the plan refused; at 1,445,760 B it
# still finds 1.1801 ms)
RETRY_WORK_SHARE = 4
# solves at most per call: the budget, then tightened by what an answer was found to take beyond it
FIT_ROUNDS = 4


def as_given(exact: IndexedProblem, sol: Solution) -> Solution:
    """`sol` with its objective and peak those of the problem as given (`exact`, unfolded): folding reorders
    float sums in the last bits."""
    if sol.choice:
        sol.objective, sol.peak_bytes, _ = evaluate_indexed(exact, *exact.vectors(sol.choice, sol.checkpointed))
    return sol


def refine_answer(search: PricedSolve, ip: IndexedProblem, exact: IndexedProblem, name: str, deadline: float,
            beaten: Callable[[float], bool] | None, small: bool, prove: bool, sol: Solution,
            over: Callable[[Solution], int] = lambda s: 0, *, known: Solution | None, held: bool,
            at: int | None = None, share: int = 1, certify: bool = True) -> Solution:
    """For the answer `solve` keeps of a priced round (once per solve, not for every round's): its bound lifted
    (`PricedSolve.lift`); with `small` (method "auto"), the flat ILP's answer from it where that ILP is small
    (`_exact_if_small`), from `known` instead where that is faster (`solve`'s); then, where the answer is still
    not proven within EXACT_GAP: on problems of at most four blocks, the flat ILP over the options that can beat
    it (`fixing.prove`, PROVE_WORK); where that leaves it unproven, a faster one from the pinned prices' columns
    and the blocks one piece away (`PricedSolve.improve`); with `prove`, where it is still not proven optimal,
    that flat ILP without a work limit (after the work-limited one). Where it is proven for the formulas only, the
    flat ILP counting the held rows proves it as the plan counts or finds a faster answer (`_held_certified`: with
    CERTIFY_WORK by default, without a limit with `prove`). Each step's answer is taken only where
    the caller's account fits it (`over`: the bytes it takes beyond the budget by that account), so a faster
    answer the account does not fit never displaces one it does. Its figures are those of the problem as given
    (`exact`). None of them where an answer found elsewhere beats its bound. `held`, `certify`: `solve`'s; `at`: the
    budget `over` judges by (`_fixed`); `share`: the flat ILPs over what can beat it get PROVE_WORK / share (`solve`'s
    search for a faster answer from a tightened round, whose bounds are not taken: RETRY_WORK_SHARE)."""
    search.lift(sol, deadline)
    out = _faster_known(exact, sol, known, over)
    # `known` in place of a priced answer no faster than it: the judge refused that answer, one the formulas fit, so
    # the proofs count the held rows from the start (HF BERT, 64 ranks, 2x its smallest budget: the proof without
    # them found the refused answer again, 1.6 s CPU)
    held = held or (out is not sol and not out.objective < sol.objective)
    if small:
        out = _fitting(exact, out, _exact_if_small(ip, out, name, deadline, beaten), over)
    if fixing.applies(ip) and worth_refining(out, beaten):
        out = _fixed(search, ip, exact, name, deadline, out, over, PROVE_WORK // share, held, at)
    if worth_refining(out, beaten):
        out = _fitting(exact, out, search.improve(out, name, deadline), over)
    if prove and out.status == "feasible" and out.choice and not (beaten is not None and beaten(out.bound)):
        out = _fixed(search, ip, exact, name, deadline, out, over, None, held, at)
    # (not where a plan found elsewhere is faster than this answer; its own, told to `beaten` once its plan fitted
    # (`meshes.plan_mesh`'s `tell`), is not: the answer's bound can lie above its time by float noise)
    if (certify and out.status == "optimal" and not out.plan_proven and ip.has_held and fixing.applies(ip)
            and not (beaten is not None and beaten(out.objective * (1 - GAP_TOLERANCE)))):
        out = _held_certified(search, ip, exact, name, deadline, out, over, at, None if prove else CERTIFY_WORK)
    return sol if out is sol else as_given(exact, out)


def _held_certified(search: PricedSolve, ip: IndexedProblem, exact: IndexedProblem, name: str, deadline: float,
                    out: Solution, over: Callable[[Solution], int], at: int | None, work: int | None) -> Solution:
    """`out`, proven optimal for the formulas only, proven against the plan's accounting, or a faster answer the
    plan fits. The formulas count some answers above the plan (saved tensors that share a storage, a checkpointed
    block's recomputation), so their optimum can be refused a faster answer the plan fits (tiny HF LLaMA, 8 ranks,
    2x2x2, 2x its smallest budget: 0.1893 ms proven for the formulas, 0.1721 ms proven here; HF BERT, 64 ranks,
    4x4x4, 1.5x: 3.0894 ms, 3.0725 ms found, 0.66 % from the held rows' bound); the held rows count no more than
    the plan. So: the flat ILP counting them over the options that can beat `out`, from `out` unproven (`_fixed`,
    held rows from the start). (Its options are fixed by the formulas' reduced costs, as every held proof's:
    `Solution.plan_proven`.)

    With `prove` (`work` None): without a work limit, over every level where the formulas' ranges leave none that
    can beat `out` (`_fixing_ranges`). By default (`work`: CERTIFY_WORK), over the ranges that can beat `out`, or
    where none can, over every level where reduced-cost fixing keeps at most CERTIFY_SHARE of the options. Its
    bound, where it proves one, is the answer's: a held bound below `out` leaves it "feasible" with that gap, which
    holds for the plan (`HELD_BOUND`); none leaves `out` as it was, proven for the formulas, as it says."""
    wide = work is not None and not _beatable(search, out.objective)
    if wide:
        from planner.search.solve import fastest_bound  # (that package imports this module)

        if not fastest_bound(exact.problem, name) < out.objective * (1 - GAP_TOLERANCE):
            return out  # the fastest assignment whatever its memory: proven as any accounting counts it, which
            # `meshes._fastest_of_all` says (the held proof over every level took as long for nothing)
    doubt = copy.copy(out)
    doubt.status, doubt.bound, doubt.gap = "feasible", math.nan, math.nan
    doubt.message, doubt.formulas_proven = HELD_BOUND, True
    got = _fixed(search, ip, exact, name, deadline, doubt, over, work, True, at, CERTIFY_SHARE if wide else None)
    if got is doubt and math.isnan(doubt.bound):
        return out  # no held proof came of it (the deadline, its work limit): the formulas' proof, as it says
    if got is doubt and doubt.plan_proven:  # the held rows' bound at the budget closed the gap (`_fixed`, `_closes`)
        doubt.message = "; ".join(m for m in doubt.message.split("; ") if m != HELD_BOUND)
    return got


def _fitting(exact: IndexedProblem, out: Solution, new: Solution, over: Callable[[Solution], int]) -> Solution:
    """`new`, a refinement of `out`, where the account fits it (`over` at most 0); else `out` with `new`'s lower
    bound (which holds for every answer, fitting or not)."""
    if new is out or over(as_given(exact, new)) <= 0:
        return new
    out.raise_bound(new.bound, GAP_TOLERANCE)
    return out


def _faster_known(exact: IndexedProblem, sol: Solution, known: Solution | None,
                  over: Callable[[Solution], int] | None = None) -> Solution:
    """`sol`, or `known` (an answer the caller knows to fit) with `sol`'s lower bound, which holds for every answer of
    the problem, where `known` is faster, or where what the refinements are judged by (`over`; `solve`'s `judge`,
    or the held rows' peak) refuses `sol` and fits `known`: the proofs then search for answers faster than `known`
    that fit, not than `sol`, which does not (HF BERT, 64 ranks, 2x its smallest budget: the bound 1.7158 ms, the
    priced answer's, the plan 1.7556 ms; proven from the plan, 1.7495 ms)."""
    if known is None or not known.choice:
        return sol
    faster = known.objective < sol.objective
    if not faster and (over is None or not over(sol) > 0):
        return sol
    why = "faster than this solve's" if faster else "this solve's does not fit"
    out = as_given(exact, Solution(status="feasible", choice=dict(known.choice), checkpointed=list(known.checkpointed),
                                    seconds=sol.seconds, solver=sol.solver, method=sol.method,
                                    message=f"{NOT_PROVEN}; the caller's answer, {why}"))
    if not faster and over(out) > 0:
        return sol
    out.raise_bound(sol.bound, GAP_TOLERANCE)
    return out


def _fixed(search: PricedSolve, ip: IndexedProblem, exact: IndexedProblem, name: str, deadline: float,
           out: Solution, over: Callable[[Solution], int], work_limit: int | None, held: bool = False,
           at: int | None = None, max_share: float | None = None) -> Solution:
    """`out`, or the answer of the flat ILP over the options that can beat it (`fixing.prove`, with this work
    limit) where the caller's account fits that (`over`: the bytes it takes beyond the budget by the account).
    Where it does not, `out` with the bound it proves, and the same ILP again under the budget tightened by
    what the account counted beyond the formulas (at least doubling, FIT_ROUNDS in all, as `solve`'s rounds;
    by at most RETRY_SHRINK of the budget) while the last answer beats `out` by over EXACT_GAP (a tightened
    ILP's answer is no faster): the first faster answer the account fits is taken. The tightened ILPs' bounds
    hold for their budgets only: taken only where that is no tighter than the budget `over` judges by (`at`: a
    round loosened by what the formulas count beyond the plan) and the ILP counts the held rows, which count no
    more than the plan (gpt-tiny on 4x4x4 at 1.5x its smallest budget, loosened by 2 KiB: 2.9380 ms proven at
    the budget, 1.96 % unproven before). (HF BERT on 64 ranks, 8x8, at its smallest budget: 256 B over, and again: 52.57 -> 51.45 ms.)
    The ILPs count the gradients held beside each op (`build_flat(held=True)`) once an answer without them is
    refused, or from the start with `held`. `max_share`: `fixing.prove`'s (none solved where it keeps more)."""
    ranges = _fixing_ranges(search, out.objective)
    # without the held rows first where they were not asked for, then (where the account refuses that answer) the
    # same ILPs counting them, as the plan's accounting does
    counting = (False,) if not ip.has_held else (True,) if held else (False, True)
    proved = None
    for held in counting:
        again = fixing.prove(ip, out, ranges, name, deadline, work_limit=work_limit, held=held, max_share=max_share)
        if again is None:
            break
        proved, (excess, beyond) = again, _judged(ip, exact, again, over)
        if excess <= 0:
            # the held rows count no more than the plan: proven at the budget it is judged by (or a looser one),
            # no answer the plan fits is faster (`meshes.use_room` has nothing to look for)
            proved.plan_proven = held and proved.status == "optimal" and at is not None and ip.budget >= at
            return proved
    if proved is None:
        return out
    # its answer does not fit the account: the bound of the last proof still holds, the held rows' where they were
    # counted (below the plan's accounting; the formulas' can lie above an answer the plan fits: HF LLaMA, 64 ranks,
    # 1.25x its smallest budget, 3.5528 ms proven for the formulas, 3.5148 ms found fitting the plan)
    out.raise_bound(proved.bound, GAP_TOLERANCE)
    # ... and where the held rows' bound, at the budget, closes the gap, the answer is proven as the plan counts
    # (gpt-tiny on 4x4x4 at 1.5x its smallest budget, loosened by 2 KiB: 2.9380 ms)
    out.plan_proven = out.plan_proven or (held and at is not None and ip.budget >= at and _closes(proved, out))
    out.message = "; ".join(m for m in (out.message, "lower bound from the flat ILP over the options that can "
                                        "beat it, whose answer the plan's accounting does not fit") if m)
    shrink = 0
    for _ in range(FIT_ROUNDS - 1):
        if not proved.objective < out.objective * (1 - EXACT_GAP):  # a tightened ILP's answer is no faster than
            break  # the last one's: not worth another ILP where that one gains less than EXACT_GAP
        # what the answer counted beyond the ILP's own peak, at least double the last tightening (none: the
        # same ILP again, HF LLaMA 64 ranks 1.25x, where a held ILP's answer fits it and not the formulas)
        shrink = max(beyond, 2 * shrink)
        if not 0 < shrink <= RETRY_SHRINK * ip.budget:
            break
        tight = copy.copy(ip)
        tight.budget = ip.budget - shrink
        proved = fixing.prove(tight, out, ranges, name, deadline, held=held,
                              work_limit=None if work_limit is None else work_limit // RETRY_WORK_SHARE)
        if proved is None:
            break
        if held and at is not None and tight.budget >= at:
            out.raise_bound(proved.bound, GAP_TOLERANCE)
            out.plan_proven = out.plan_proven or _closes(proved, out)
        excess, beyond = _judged(ip, exact, proved, over)
        if excess <= 0 and proved.objective < out.objective:
            return _unproven(proved, out, f"under the budget tightened by {shrink} B for what the plan's accounting "
                                          "counts beyond the formulas")
    return out


def _closes(proved: Solution, out: Solution) -> bool:
    """Whether `proved`'s bound alone proves `out` optimal (within GAP_TOLERANCE), whatever bound `out` held before (a
    bound above `out`'s time is none of its problem: `Solution.raise_bound`)."""
    return (out.status == "optimal" and math.isfinite(proved.bound) and relative_gap(out.objective, proved.bound)
            <= GAP_TOLERANCE and proved.bound <= out.objective * (1 + GAP_TOLERANCE))


def held_exact(problem: Problem, budget: int, start: Solution, name: str, deadline: float) -> Solution | None:
    """The flat ILP with held rows (`build_flat(held=True)`) over every option at `budget`, started from `start`
    (an answer the plan's accounting fits, with no bound: the least-memory plan at the smallest budget), where the
    problem is small (at most `fixing.MAX_BLOCKS` blocks, held rows, EXACT_FLAT_PAIRS pairs); None elsewhere.
    The held rows count no more than the plan's accounting, so its optimum bounds every answer the plan fits and
    its answer, where the plan fits it, is the mesh's optimum (mlp on 2x2x2 at its smallest budget, 178,728 B,
    where the optimizer step binds: 0.5753 ms without a bound -> 0.3609 ms proven). PROVE_WORK at most."""
    ip = IndexedProblem(problem)
    ip.budget = budget
    if not (ip.has_held and fixing.applies(ip) and flat_pairs(ip) <= EXACT_FLAT_PAIRS and start.choice):
        return None
    began = time.perf_counter()
    built = build_flat(ip, "time", budget, held=True)
    res = solve_milp(built.model, solver=name, time_limit=deadline - time.perf_counter(), work_limit=PROVE_WORK,
                     mip_start=built.encode(*ip.vectors(start.choice, start.checkpointed)),
                     options=fixing.PROVE_OPTIONS)
    if res.x is None:
        return None
    picked, blocks = built.extract(res.x)
    time_s = evaluate_indexed(ip, picked, blocks)[0]
    bound = time_s if res.status == "optimal" else res.bound / built.scale if math.isfinite(res.bound) else math.nan
    out = Solution(status="feasible", choice=dict(zip(ip.names, picked)), checkpointed=[ip.block_names[b] for b in blocks],
                   objective=time_s, gap=float("nan"), seconds=time.perf_counter() - began, solver=resolve_solver(name),
                   peak_bytes=held_peak(ip, picked, blocks), method="held flat ILP",
                   message="the flat ILP counting the held rows and the optimizer step over every option")
    out.raise_bound(bound, GAP_TOLERANCE)
    return out


def _unproven(found: Solution, out: Solution, how: str) -> Solution:
    """A faster answer than `out` that the plan fits, from an ILP whose bound is not taken: a copy of `found`,
    unproven, with `out`'s bound and a message saying how it was found."""
    found = copy.copy(found)
    found.bound, found.status, found.gap = float("nan"), "feasible", float("nan")
    found.message = f"{NOT_PROVEN}; found by the flat ILP over the options that can beat {out.objective * 1e3:.4f} ms {how}"
    found.raise_bound(out.bound, GAP_TOLERANCE)
    return found


def _judged(ip: IndexedProblem, exact: IndexedProblem, proved: Solution, over: Callable[[Solution], int]
            ) -> tuple[int, int]:
    """For an answer of `fixing.prove` under `ip`'s budget: (the bytes it takes beyond the budget by the caller's
    account, `over`; the bytes that account counts beyond the ILP's own peak, which counts the held rows where
    it has them, not the formulas alone), with `proved`'s figures made those of `exact`."""
    model = proved.peak_bytes
    excess = over(as_given(exact, proved))
    return excess, ip.budget + excess - model


def _beatable(search: PricedSolve, target: float) -> list[tuple[float, Price]]:
    """The ranges of max-term levels of the answer's bound search (`PricedSolve.ranges`), as (floor level, price),
    that may hold an assignment faster than `target` by the formulas (none where it did not run)."""
    return [(floor, price) for own, floor, price in search.ranges or () if not own >= target]


def _fixing_ranges(search: PricedSolve, target: float) -> list[tuple[float, Price]]:
    """The ranges of max-term levels `fixing.prove` prices options in, as (floor level, price): `_beatable`'s, or
    where the bound search did not run, or where none may beat `target` (an answer proven optimal for the formulas,
    proven again counting the held rows with `prove`: `_held_certified`), every level from the floor up under the
    price that proved the best bound (wide: the held proof of HF LLaMA, 64 ranks, at its smallest budget keeps
    1,361 of 1,396 options and stops at CERTIFY_WORK, 8.5 s, 41 % from its bound)."""
    return _beatable(search, target) or [(search.floor, search.bound_price())]


def worth_refining(sol: Solution, beaten: Callable[[float], bool] | None) -> bool:
    """Whether a search for a faster answer than `sol` can pay: it is not proven within EXACT_GAP of the
    optimum (a NaN gap: no bound at all), and no answer found elsewhere beats its lower bound already
    (`solve`'s `beaten`: no answer here could win)."""
    unproven = sol.status == "feasible" and bool(sol.choice) and not sol.gap <= EXACT_GAP
    return unproven and not (beaten is not None and math.isfinite(sol.bound) and beaten(sol.bound))


def _exact_if_small(ip: IndexedProblem, sol: Solution, name: str, deadline: float,
                    beaten: Callable[[float], bool] | None) -> Solution:
    """`sol`, a priced answer, or where it is not proven within EXACT_GAP and the flat ILP is small (EXACT_FLAT_PAIRS,
    with EXACT_WORK; on problems `fixing.prove` does not take, EXACT_FLAT_PAIRS_MANY, with the usual WORK_LIMIT above
    EXACT_FLAT_PAIRS), the flat ILP's answer from it (a MIP start: never worse), with the better of the two lower
    bounds. Not where an answer found elsewhere beats its lower bound already (`solve`'s `beaten`): no answer here
    could win."""
    if not worth_refining(sol, beaten):
        return sol
    pairs, many = flat_pairs(ip), not fixing.applies(ip)
    if pairs > (EXACT_FLAT_PAIRS_MANY if many else EXACT_FLAT_PAIRS):
        return sol
    start = ip.vectors(sol.choice, sol.checkpointed)
    flat = solve_built(ip, functools.partial(build_flat, ip), solver=name, deadline=deadline,
                       method="flat", initial=start, work_limit=WORK_LIMIT if pairs > EXACT_FLAT_PAIRS else EXACT_WORK)
    if flat.status not in ("optimal", "feasible") or flat.peak_bytes > ip.budget:
        return sol
    if flat.objective < sol.objective:
        flat.raise_bound(sol.bound, GAP_TOLERANCE)
        return flat
    sol.raise_bound(flat.bound, GAP_TOLERANCE)
    return sol
