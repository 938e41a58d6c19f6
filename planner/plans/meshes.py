"""Plan one mesh shape: build, solve and assemble it (`plan_mesh`), and the follow-up solves of a mesh (`use_room`,
`narrow_least`). `planner.plans.workers` runs the meshes side by side.

Per mesh (`plan_mesh`), the assembled plan's accounting decides whether the answer fits: it adds working
sets the per-choice problem cannot see (a layout conversion's staging buffers, which depend on both
ends' choices, and the recomputed activations alive beside an op in a checkpointed block's backward).
The plan's bound is `solve`'s account: when it exceeds the budget, `solve` tightens its budget by what the plan
counts beyond the solver's model (at least the excess) and solves again (the one tighten-and-retry loop).

A mesh is given `beaten(bound)`: whether a plan found elsewhere is faster than every plan a search with that lower
bound could give (`workers.Incumbent`, shared by the meshes planned side by side); its search then stops.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cost_models.mesh import Mesh
from planner.plans.assemble import solver_info
from planner.plans.format import Plan
from planner.search.build import BuiltProblem, SchemeUnavailable
from planner.search.solve import Problem, Solution, evaluate, fastest_bound, solve
from planner.search.solve.min_budget import SolveMemo
from planner.search.solve.problem import GAP_TOLERANCE, NOT_PROVEN
from planner.search.solve.refine import held_exact

__all__ = ["SOLVES_PER_MESH", "MeshResult", "beats", "narrow_least", "plan_mesh", "room_to_use", "use_room"]

_LEAST_ROUNDS = 2  # fits just below the least-memory plan's bound, looking for a smaller budget that fits
# ... only where the plan counts more than the solver's model for the least-memory answer by over this
# fraction of it: about what such a fit can win (HF GPT-2 on 2x2x2: 16 KiB more, a fit finds 0.4 % less)
_LEAST_GAIN = 1e-3
_BEATEN_MARGIN = 1e-9  # a mesh stops when its lower bound exceeds another mesh's plan by this much (relative)
_ROOM = 0.01  # the formulas counting this share of the budget more than the best plan: worth one more solve
_ROOM_GAP = 0.01  # ... unless its answer is proven this close to the formulas' optimum
# ... or, for a model of at most _ROOM_BLOCKS repeated blocks (where the second solve is cheap), even then: a
# proven answer of the formulas can be far from the fastest plan the accounting fits (tiny HF LLaMA, 8 ranks,
# 4x its smallest budget, proven optimal, room 5.5 %: 0.0412 -> 0.0371 ms; tiny HF BERT, room 9.1 %: 0.0300 ->
# 0.0269 ms; at 2x, room 1.2 %: 0.2142 -> 0.2041 ms; tiny HF GPT-NeoX, 64 ranks, 1.25x, room 3.2 %: 2.7004 ->
# 2.5085 ms). The room does not tell where it pays: tiny HF BERT on 64 ranks at 1.25x, room 1.7 %, takes 5 ->
# 33 s CPU for the same plan. Small models' answers are mostly proven by default (`fixing.prove`).
_ROOM_BLOCKS = 4
_HELD_ROUNDS = 3  # solves of the held flat ILP at most for the least-memory plan's mesh (`_held_fitting`)
# The problem counting a tensor several decisions of a block save once (`BuiltProblem.problem`) is solved first
# for a model of at most this many repeated blocks; for more, the one counting apart (`BuiltProblem.apart`). On
# LLaMA-3-8B (32 layers, 64 ranks, 40 GiB) the answers counted once take q's and k/v's common input in two
# layouts on every mesh (4x4x4: 10.7 MB over the budget), so the one counting apart was solved after it: the
# same plans, 4.5 s of solve for 4x4x4 against 2.8 s.
_ONCE_BLOCKS = _ROOM_BLOCKS
SOLVES_PER_MESH = _LEAST_ROUNDS + 3  # `solve` calls of one mesh at most (`plan_mesh`, `use_room`, `narrow_least`)


@dataclass
class MeshResult:
    """One mesh's outcome: a plan that fits, or the least peak found (a budget that fits), or why the
    mesh cannot be used (`unavailable`), or an error message."""

    mesh: Mesh
    plan: Plan | None = None
    objective: float = float("inf")
    least: int | None = None
    unavailable: str = ""
    error: str = ""
    beaten: bool = False  # stopped: a plan found on another mesh is proven faster than any plan here
    answer: Solution | None = None  # the solver's answer the plan is of (`use_room`)
    narrow: bool = False  # `least` is the least-memory plan's bound; fits below it are left to `narrow_least`
    least_peak: int | None = None  # with `narrow`: the solver's formulas' peak for that least-memory answer
    apart: bool = False  # `answer` is of the problem counting saved tensors apart (`BuiltProblem.apart`)
    # the mesh's built problem, from a worker process, where the planning process may plan the mesh again
    # (`use_room`): sent back rather than built again (HF LLaMA's 4x4x4: 2.7 MB, 0.1 s to pickle and load, 0.8 s to build)
    built: BuiltProblem | None = None


def beats(objective: float, bound: float) -> bool:
    """Whether a plan of step time `objective` is faster than every plan of a search whose lower bound is `bound`
    (relative margin _BEATEN_MARGIN, above the solvers' float noise)."""
    return bound > objective * (1 + _BEATEN_MARGIN)


class _PlanAccount:
    """The assembled plan's bound as `solve`'s account, keeping the plan of the last answer it measured; and
    the solves of one mesh's problem measured by it (`solve`)."""

    def __init__(self, built: BuiltProblem, assemble: Callable[[BuiltProblem, Solution], Plan],
                 apart: bool = False, tell: Callable[[float], None] | None = None) -> None:
        self.built, self.assemble, self.tell = built, assemble, tell
        # the problem solved: the mesh's, or (apart, and always for more than _ONCE_BLOCKS blocks) the one with
        # every decision counting what it saves
        self.apart = (apart or len(built.problem.blocks) > _ONCE_BLOCKS) and built.apart is not None
        self.problem, self.step_problem = built.apart if self.apart else (built.problem, built.step_problem)
        self.last: tuple[Solution, Plan] | None = None
        # what the solves below find that does not depend on the budget (the least-memory answers), once each
        self.memo = SolveMemo(self.problem)
        self.step_memo = SolveMemo(self.step_problem) if self.step_problem is not None else None
        self.budget: int | None = None
        # an answer the plan's accounting refused may be short of a tensor counted once (`_short`)
        self.undercounted = False

    def solve(self, budget: int, **options: Any) -> Solution:
        """`solve` of the mesh's problem at `budget` measured by this account, with its step problem (where
        the optimizer step is what an answer does not fit) and the memos every solve of this mesh shares."""
        self.budget = budget
        sol = solve(self.problem, budget=budget, account=self, memo=self.memo, step_problem=self.step_problem,
                    step_binds=self.step_binds, step_memo=self.step_memo, certify=not self.apart, **options)
        if self.apart:  # that problem counts more than the plan for some answers: its proofs are not the plan's
            sol.plan_proven = False
        return sol

    def __call__(self, sol: Solution) -> int:
        plan = self.assemble(self.built, sol)
        self.last = (sol, plan)
        bound = plan.predicted.bound_bytes
        if self.tell is not None and self.budget is not None and bound <= self.budget:
            self.tell(sol.objective)  # a plan that fits: the mesh's is no slower (`plan_mesh`'s `tell`)
        if (self.budget is not None and bound > self.budget and self.built.apart is not None
                and not self.apart and not self.undercounted):
            self.undercounted = self._short(sol)
        return bound

    def _short(self, sol: Solution) -> bool:
        """Whether the problem counts fewer bytes for this refused answer than the problem counting apart: it may
        be refused for a tensor counted once that two decisions take in different layouts. (The plan's per-op
        saved bytes would tell, but not inside a checkpointed block, where the plan counts them as the
        recomputation's; where the refusal has another cause, the solve counting apart finds the same plan.)"""
        return (evaluate(self.built.apart[0], sol.choice, sol.checkpointed)[1]
                > evaluate(self.problem, sol.choice, sol.checkpointed)[1])

    def step_binds(self, sol: Solution) -> bool:
        """Whether the optimizer step sets `sol`'s bound: it holds more beside the states than the backward's
        activations and transient (`Predicted.bound_bytes`)."""
        return self.plan(sol).predicted.step_sets_bound

    def plan(self, sol: Solution) -> Plan:
        """The plan of `sol`; its solver block as `sol` says now (`solve` raises the bound and adds notes after
        measuring the answer)."""
        if self.last is None or self.last[0] is not sol:
            self(sol)
        plan = copy.copy(self.last[1])
        plan.solver = solver_info(sol)
        return plan


def plan_mesh(mesh: Mesh, build: Callable[[Mesh], BuiltProblem], assemble: Callable[[BuiltProblem, Solution], Plan],
              budget: int, *, solver: str, time_limit: float | None = None,
              beaten: Callable[[float], bool] | None = None, loosen: int = 0, prove: bool = False,
              known: Solution | None = None, apart: bool = False,
              tell: Callable[[float], None] | None = None) -> MeshResult:
    """Build, solve and assemble one mesh (see the module docstring); `beaten`: `Incumbent.beaten` of the
    meshes planned beside this one (None: plan this mesh to the end); `loosen`: bytes the formulas are
    known to count beyond the plan's accounting here (`solve`'s, for the first solve; `use_room`); `prove`:
    `solve`'s (the exact flat ILP over the options that can beat an unproven answer); `known`: `solve`'s, for the
    first solve (an answer known to fit the budget: `use_room`'s plan at it); `apart`: solve the problem
    counting saved tensors apart (`BuiltProblem.apart`; `use_room`, for an answer of that problem); `tell(seconds)`:
    told the step time of each answer whose plan fits `budget` as soon as it is measured (`Incumbent.found`), by the
    solves of the problem counting once and apart: the plan returned is no slower (a solve keeps a later answer only
    where it is faster and fits; not `_once_bound`'s, whose answer is kept only where it is faster by GAP_TOLERANCE).
    HF Qwen2, 64 ranks, 1.25x its smallest budget, two workers, where 4x4x4's first answer is refused for a
    tensor counted once: 8x8 stopped on 4x4x4's first answer counted apart, wall 15.5 -> 10.6 s, CPU 26.0 -> 17.8 s."""
    try:
        built = build(mesh)
    except SchemeUnavailable as e:
        return MeshResult(mesh, unavailable=str(e))
    account = _PlanAccount(built, assemble, apart=apart, tell=tell)

    def fit(cap: int, loosen: int = 0, known: Solution | None = None, stop: Callable[[float], bool] | None = beaten
            ) -> Solution:
        return account.solve(cap, solver=solver, time_limit=time_limit, loosen=loosen, beaten=stop, prove=prove,
                             known=known)

    # where the problem counts a saved tensor once that decisions may save apart, its solve stops at the first
    # answer the plan's accounting refuses for that, and the problem counting apart is solved (`_counted_apart`)
    first = built.apart is not None and not account.apart and not loosen and known is None

    def stop(bound: float) -> bool:
        return account.undercounted or (beaten is not None and beaten(bound))

    # Model states count whatever the assignment: a budget below their least sum (planning at 1 byte to
    # learn the smallest budget) goes straight to the least-memory search instead of a solve that only
    # finds that out.
    states = sum(min(c.state_bytes for c in node.choices) for node in built.problem.nodes)
    if states <= budget:
        sol = fit(budget, loosen, known, stop if first else beaten)
        if first and account.undercounted:
            options = dict(solver=solver, time_limit=time_limit, beaten=beaten, prove=prove, tell=tell)
            if sol.status not in ("optimal", "feasible"):
                found = plan_mesh(mesh, build, assemble, budget, apart=True, **options)
                if found.answer is None:
                    return found
                bound, faster = _once_bound(built, assemble, budget, found.answer, sol.bound, options, account.memo)
                return faster or _widened(found, bound)
            found = _counted_apart(built, assemble, budget, sol, **options)
            if found is not None:
                return found
        if sol.status in ("optimal", "feasible"):
            _fastest_of_all(account.problem, sol, solver)
            return MeshResult(mesh, account.plan(sol), sol.objective, answer=sol, apart=account.apart)
        if sol.status == "beaten":
            return MeshResult(mesh, beaten=True)
        if sol.status != "infeasible":
            return MeshResult(mesh, error=sol.message or f"solver status {sol.status}")
        if loosen > 0:  # nothing fit with the loosening (`use_room`): the plan without it is the caller's
            return MeshResult(mesh)
    # Nothing fits. The least-memory assignment of the solver's model (asked with budget 0, so the
    # answer does not depend on this budget) fits its plan's exact peak; `narrow_least` may look for a
    # smaller one below that, where the plan's accounting sees more than the solver's model.
    least = solve(account.problem, budget=0, solver=solver, time_limit=time_limit, memo=account.memo)
    if not least.choice:
        return MeshResult(mesh, least=least.min_feasible_budget)
    least.status, least.message, least.gap = "feasible", "the least-memory assignment", float("nan")
    found = assemble(built, least)
    if found.predicted.bound_bytes <= budget:
        # The solver's model counted more than the plan does (a checkpointed block's recompute peak is an
        # upper bound there): ask it again with its budget loosened by that difference, for a faster plan
        # that still fits the plan's accounting (gpt-tiny on 2x2x2 at 454,272 B: 2.29 -> 1.72 ms).
        over = least.peak_bytes - found.predicted.bound_bytes
        if over > 0:
            sol = fit(budget, loosen=over)
            if sol.status in ("optimal", "feasible") and sol.objective < least.objective:
                return MeshResult(mesh, account.plan(sol), sol.objective, answer=sol, apart=account.apart)
        # On a small problem the flat ILP with held rows over every option bounds what the plan fits and may
        # find a faster answer it fits: the least-memory plan has no bound of its own
        deadline = math.inf if time_limit is None else time.perf_counter() + time_limit
        held_bound, exact = _held_fitting(account, budget, least, solver, deadline)
        if exact is not None and exact.objective < least.objective:
            exact.raise_bound(held_bound, GAP_TOLERANCE)
            return MeshResult(mesh, account.plan(exact), exact.objective, answer=exact, apart=account.apart)
        if math.isfinite(held_bound):
            least.raise_bound(min(held_bound, least.objective), GAP_TOLERANCE)
        fastest = -math.inf if math.isfinite(least.bound) else fastest_bound(account.problem, solver)
        if math.isfinite(fastest):  # no plan is faster than the fastest assignment, memory aside
            least.raise_bound(fastest, GAP_TOLERANCE)
            least.message += "; lower bound: the fastest assignment, whatever its memory"
        found = account.plan(least)
        if beaten is not None and beaten(least.objective):  # the least-memory plan is an answer too
            return MeshResult(mesh, beaten=True)
        return MeshResult(mesh, found, least.objective)
    smallest = found.predicted.bound_bytes
    # Where the plan counts more than the solver's model for the least-memory answer, a budget a little
    # below its bound may still fit another answer: `narrow_least` looks, once no mesh has a plan. Where it
    # counts (about) the same, such an answer would be one the least-memory search did not find, which a
    # solve just below does not look for either (and a solve at the tightest budget costs the most: HF BERT
    # on 64 ranks, 4x4x4, 23 s for 256 B at best).
    return MeshResult(mesh, least=smallest, narrow=smallest - least.peak_bytes > _LEAST_GAIN * smallest,
                      least_peak=least.peak_bytes)


def _fastest_of_all(problem: Problem, sol: Solution, solver: str) -> None:
    """Mark `sol`, proven optimal for the formulas only, proven for the plan's accounting (`Solution.plan_proven`)
    where it is the fastest assignment whatever its memory (`fastest_bound`: the time of an assignment does not
    depend on how its bytes are counted): no plan is faster. Where the budget does not bind (gpt2-small on 8 ranks at
    16 GiB, 0.04 s; HF LLaMA on 2x2x2, 0.14 s)."""
    if sol.status == "optimal" and not sol.plan_proven and sol.choice:
        sol.plan_proven = not fastest_bound(problem, solver) < sol.objective * (1 - GAP_TOLERANCE)


def _held_fitting(account: _PlanAccount, budget: int, least: Solution, solver: str, deadline: float
                  ) -> tuple[float, Solution | None]:
    """The flat ILP with held rows over every option (`held_exact`, from the least-memory answer `least`) at
    `budget`: its lower bound (NaN where it does not run), which holds for every answer the plan fits at `budget`,
    and its answer where the plan's accounting fits it. Where that refuses it (the held rows count below the plan in
    places), the ILP again under the budget tightened by what the account counts beyond it (at least doubling the
    last tightening; _HELD_ROUNDS solves in all) until an answer fits, unproven (a tightened ILP's bound holds at
    its own budget only). gpt-tiny, 8 ranks, at its smallest budget: the held ILP's 1.7195 ms is 22,640 B over by
    the plan's accounting; tightened by that, 2.1002 ms fits, against the least-memory plan's 2.6960 ms."""
    bound, shrink = math.nan, 0
    for tightened in range(_HELD_ROUNDS):
        exact = held_exact(account.problem, budget - shrink, least, solver, deadline)
        if exact is None:
            break
        if not tightened:
            bound = exact.bound
        used = account(exact)
        if used <= budget:
            # over every option at the budget, counting no more than the plan: where proven, no plan that fits is faster
            exact.plan_proven = exact.status == "optimal" and not tightened
            if tightened:
                exact.status, exact.bound, exact.gap = "feasible", math.nan, math.nan
                exact.message = (f"{NOT_PROVEN}; the flat ILP counting the held rows and the optimizer step over every "
                                 f"option, under the budget tightened by {shrink} B for what the plan's accounting "
                                 "counts beyond them")
            return bound, exact
        shrink = max(shrink + used - budget, 2 * shrink)
        if shrink >= budget:
            break
    return bound, None


def _counted_apart(built: BuiltProblem, assemble: Callable[[BuiltProblem, Solution], Plan], budget: int,
                   sol: Solution, *, beaten: Callable[[float], bool] | None, tell: Callable[[float], None] | None = None,
                   **options: Any) -> MeshResult | None:
    """The mesh solved again with every decision counting each tensor it saves (`BuiltProblem.apart`), where
    the mesh's problem, which counts a tensor several decisions of a block save once, had an answer refused
    for two of them saving it in different layouts (two copies): its answer where it is faster than `sol`,
    the answer that fits found before (None otherwise). Tightening the mesh's problem instead (`solve`'s loop)
    costs every answer those bytes: HF GPT-NeoX, 64 ranks, 1.25x its smallest budget (both layer norms of a
    layer save its input), 3.19 ms, where counted apart the plan is 2.51 ms; HF LLaMA at 1.25x, 4.49 ms on
    8x8 against 3.73 ms on 4x4x4. The answer that fits is the solve's `known` (its figures counted apart): the
    refinements search for answers faster than it, not than the priced search's own (HF BERT, 8 ranks, 1.5x its
    smallest budget: 0.5083 ms; the flat ILP over the options that can beat 0.4794 instead: 11.6 -> 6.6 s CPU,
    the same plan)."""
    fits = sol.status in ("optimal", "feasible")
    if sol.status == "optimal" or sol.formulas_proven:  # proven for the mesh's problem, which the one counting apart
        # restricts: no answer of that one is faster (HF LLaMA, 64 ranks, 2x its smallest budget: 12 s CPU spared;
        # 1.5x, "feasible" 3.1 % from the held rows' bound, proven for the formulas: 4 s)
        return None

    def stop(bound: float) -> bool:
        return (fits and beats(sol.objective, bound)) or (beaten is not None and beaten(bound))

    account = _PlanAccount(built, assemble, apart=True, tell=tell)  # (the plan is `sol` or a faster one of this solve)
    counted = account.solve(budget, beaten=stop, known=_counted_by(account.problem, sol) if fits else None, **options)
    if counted.status not in ("optimal", "feasible") or (fits and counted.objective >= sol.objective):
        return None
    # The answer's bound is the lesser of the two solves': the problem counting apart restricts the mesh's (it
    # counts more for some answers), so its optimum, and its bound, may lie above the mesh's optimum (HF Qwen2,
    # 8 ranks, 1.5x, where the first answer found is refused: 0.4014 ms "0.87 % from its bound" counted apart,
    # while 0.3951 ms fits the plan's accounting).
    apart = MeshResult(built.mesh, account.plan(counted), counted.objective, answer=counted, apart=True)
    if fits:
        return _widened(apart, sol.bound)
    once, faster = _once_bound(built, assemble, budget, counted, sol.bound, dict(options, beaten=beaten))
    return faster or _widened(apart, once)


def _once_bound(built: BuiltProblem, assemble: Callable[[BuiltProblem, Solution], Plan], budget: int, found: Solution,
                bound: float, options: dict[str, Any], memo: SolveMemo | None = None) -> tuple[float, MeshResult | None]:
    """A lower bound of the mesh's problem (counting once) at `budget`, for `found`, an answer counted apart, where the
    first solve stopped at its first refused answer before it had an answer that fits (its `bound`, often far below:
    HF LLaMA 64 ranks 1.25x, 22.8 %): where `found`'s own bound is higher, the best of `bound` and a solve of that
    problem from `found` (`known`) that stops once its bound reaches `found`'s time (then `found` is optimal counted
    once too). Its refinements are judged by the plan's accounting (`solve`'s `judge`): a proof whose answer the plan
    refuses is proven again counting the gradients held beside each op, and under a tightened budget (`refine._fixed`), as
    in the first solve. Once with the held proofs in a second solve of their own, that solve's proof started from
    the priced answer, which the held rows refuse, and its first answer they fit ended it, refused by the plan:
    one solve is cheaper and goes on (HF LLaMA, 64 ranks, 1.25x: 3.5914 -> 3.5148 ms, 0.58 % from the held
    rows' bound; HF BERT at 2x: gap 2.27 -> 0.34 %). A first solve that ended with an answer that fits ran its
    refinements: its bound is taken as it is (HF LLaMA 64 ranks 2x: the solve from the answer took 3 s for the same
    bound). Where that solve's answer is proven as the plan counts (`Solution.plan_proven`) and `found` is no slower,
    `found` is too (HF BERT 64 ranks 2x: 1.7556 ms; the proofs of the problem counting apart are not the plan's). Also
    the solve's answer, as a mesh result, where it is faster than `found` and the plan's accounting fits it, else
    None. `memo`: the first solve's (its priced search, at this budget, is this solve's too)."""
    beaten = options.get("beaten")
    if not math.isfinite(found.bound) or found.bound <= bound or (beaten is not None and beaten(found.objective)):
        return bound, None  # (where another mesh's plan is faster, this plan loses: its bound does not matter)
    account = _PlanAccount(built, assemble)
    once = solve(built.problem, budget=budget, known=_counted_by(built.problem, found),
                 beaten=lambda b: not b < found.objective, solver=options.get("solver", "highs"),
                 time_limit=options.get("time_limit"), judge=account, memo=memo)
    if math.isfinite(once.bound):
        bound = max(bound, once.bound)
    if once.plan_proven and not once.objective < found.objective * (1 - GAP_TOLERANCE):
        found.plan_proven = True  # no plan that fits is faster than `once`'s answer, and `found` fits, no slower
    if (once.status in ("optimal", "feasible") and once.choice and once.objective < found.objective * (1 - GAP_TOLERANCE)
            and account(once) <= budget):
        once.raise_bound(bound, GAP_TOLERANCE)  # every solve's bound holds for the problem counting once
        return bound, MeshResult(built.mesh, account.plan(once), once.objective, answer=once)
    return bound, None


_WIDER = "the bound is that of the problem counting a tensor several decisions save once"


def _widened(result: MeshResult, bound: float) -> MeshResult:
    """`result` with its answer's bound lowered to `bound` where that is lower (`Solution.widen_to`: the bound of
    the problem counting once, which the one counting apart restricts) and its plan's solver block to match."""
    if result.answer is not None and result.plan is not None:
        result.answer.widen_to(bound, GAP_TOLERANCE, _WIDER)
        result.plan.solver = solver_info(result.answer)
    return result


def _counted_by(problem: Problem, sol: Solution) -> Solution:
    """`sol` with its time and peak as `problem` counts them (an answer of another view of the same decisions)."""
    out = copy.copy(sol)
    out.objective, out.peak_bytes, _ = evaluate(problem, sol.choice, sol.checkpointed)
    return out


def narrow_least(mesh: Mesh, build: Callable[[Mesh], BuiltProblem], assemble: Callable[[BuiltProblem, Solution], Plan],
                 budget: int, smallest: int, *, target: int | None = None, least_peak: int | None = None,
                 solver: str, time_limit: float | None = None) -> MeshResult:
    """A smaller budget that fits `mesh` than `smallest`, the bound of its least-memory plan (`plan_mesh`'s
    `least` with `narrow`), and than `target` (default `smallest`): the least such bound over all meshes,
    since only a plan below it lowers the smallest budget the user is told, or fits `budget` (which is below
    it). Solves just below the lower of the two by the plan's account, _LEAST_ROUNDS at most, each answer's
    bound the next limit; a plan whose bound fits `budget` is the mesh's plan. Run only when no mesh has a
    plan, so the plan returned never depends on it; and re-planning at the budget reported takes these same
    steps and meets it. (gpt-tiny on 8 ranks: 2x4 narrowed from its own 477,712 B to 462,336 B in four
    solves, where (8,)'s least-memory plan took 453,392 B.)"""
    built = build(mesh)
    account = _PlanAccount(built, assemble)
    limit = smallest if target is None else min(smallest, target)
    # what the plan counted beyond the solver's formulas for the last answer, at first the least-memory one's
    excess = 0 if least_peak is None else max(0, smallest - least_peak)
    for _ in range(_LEAST_ROUNDS):
        # each round starts that much below its limit: its answers are alike, and a round that starts at the
        # limit is sent back for that excess first (HF GPT-2, 8 ranks: two solves of 2 s each saved)
        # (unrefined: only its peak counts here, unless it fits the budget)
        options = dict(solver=solver, time_limit=time_limit, loosen=-excess, least="never")
        sol = account.solve(limit - 1, refine=False, **options)
        if sol.status not in ("optimal", "feasible"):
            break
        q = account.plan(sol)
        if q.predicted.bound_bytes <= budget:
            # the same solve refined (its search kept: `solve`'s `refine`), where the plan fits that answer too
            better = account.solve(limit - 1, known=sol, **options)
            if better.status in ("optimal", "feasible") and better.objective < sol.objective:
                plan = account.plan(better)
                if plan.predicted.bound_bytes <= budget:
                    return MeshResult(mesh, plan, better.objective)
            return MeshResult(mesh, q, sol.objective)
        limit = smallest = q.predicted.bound_bytes
        excess = max(0, smallest - sol.peak_bytes)
    return MeshResult(mesh, least=smallest)


def room_to_use(best: MeshResult, budget: int, proven_too: bool = False, blocks: int | None = None) -> int | None:
    """The bytes `use_room` loosens `best`'s mesh by (what the formulas count beyond the plan for its answer), or
    None where it keeps `best` as it is (see there)."""
    if best.plan is None or best.answer is None or (best.answer.plan_proven and not best.apart):
        return None
    gap = best.plan.solver.gap
    room = best.answer.peak_bytes - best.plan.predicted.bound_bytes
    if room <= _ROOM * budget:
        return None
    small = blocks is not None and blocks <= _ROOM_BLOCKS
    if gap is not None and gap <= _ROOM_GAP and not (proven_too or small):  # proven within 1 % of the optimum
        return None
    return room


def use_room(best: MeshResult, budget: int,
             job: Callable[[Mesh, int, Solution, Callable[[float], bool], bool], MeshResult],
             proven_too: bool = False, blocks: int | None = None) -> MeshResult:
    """The best mesh's plan, or a faster one on that mesh where the solver's formulas count more than the
    plan's accounting for its answer by over _ROOM of the budget (tensors from outside the blocks that
    several blocks save, a checkpointed block's recomputation, which the plan counts op by op):
    `job(mesh, loosen, known, beaten, apart)` plans it again with the budget loosened by that difference (on
    the problem the answer is of: `MeshResult.apart`), and its
    answer is measured by the plan's account like any other. The best answer fits the loosened budget too:
    the solve is given it (`known`: what its refinement must beat; HF BERT, 64 ranks, 1.25x its smallest
    budget: the re-solve's reduced-cost fixing 18.6 -> 4.5 s CPU) and stops once its lower bound shows it
    cannot beat it (`beaten`). Only the winner, so that it costs one solve, and only
    where its answer is not proven within _ROOM_GAP of the formulas' optimum (the solve costs as much as
    the first: LLaMA-3-8B on 64 ranks at 40 GiB, gap 0.15 %, 5.7 -> 13.5 s for a 0.8 % faster plan; HF
    LLaMA, 8 ranks, at 2x its smallest budget, gap 40 %: the formulas counted 7.8 % of the budget more, and
    the plan comes out 24 % faster). Also where it is proven, with `proven_too` (`plan(prove=True)`, where
    answers are proven optimal for the formulas), or for a model of at most _ROOM_BLOCKS repeated `blocks`:
    the loosened solve is what finds the faster plan the accounting allows. Never where the answer was proven by
    the flat ILP counting the held rows at the budget (`Solution.plan_proven`; of the problem counting a tensor
    several decisions save once: the one counting apart can count more than the plan): those rows count no more than
    the plan, so no answer the plan fits is faster (gpt-tiny, 64 ranks, at its smallest budget: 19.5 s of re-solve
    for the same plan; HF LLaMA, 64 ranks, at 2x: 1.7 s)."""
    room = room_to_use(best, budget, proven_too, blocks)
    if room is None:
        return best
    roomier = job(best.mesh, room, best.answer, functools.partial(beats, best.objective), best.apart)
    if roomier.plan is None or not roomier.objective < best.objective:
        return best
    if roomier.answer is None:  # the least-memory plan
        return roomier
    return _widened(roomier, best.answer.bound)  # the best answer's bound holds for every answer (`_counted_apart`)
