"""Two-level solve for repeated blocks (DESIGN §6, "Identical blocks are the hard case").

Level 1: for one representative of each class of identical blocks, `block_frontier` lists the Pareto
frontier of (additive bytes, max-term bytes, time) per boundary (port choice p, output choice q) and
checkpoint flag. Level 2: an outer ILP over the non-block nodes (one-hot as in the flat ILP) and, per
segment of m chained blocks of one class, an integer count n_π in [0, m] per frontier point π:

* sum_π n_π = m; the points are arcs p -> q of a walk through the output node's choices that starts at
  the port's choice and ends at the last output's choice: per choice v,
  sum_{p(π)=v} n_π - sum_{q(π)=v} n_π = start[v] - end[v] (degree balance),
* the walk must be connected to its start: a flow of 1/m per arc end, sourced at the start choice and
  carried only by used arcs (f_a <= sum of n_π on arc a), so no detached cycle of arcs is counted,
* memory adds sum n_π·add_bytes(π); the max term gets T >= L·λ_L per distinct max_bytes value L, with a
  binary λ_L forced to 1 when any point with that value is used,
* time adds sum n_π·time_s(π).

* a valid cut T >= (sum n_π·max_bytes(π)) / m (the max is at least the mean) tightens the relaxation,
* a shared input (problem.py) adds its bytes on a binary at least each reading segment's share of
  checkpointed blocks.

An Eulerian trail of the chosen arcs orders the points along the segment, so each block gets its own point
(per-layer mixing is kept) and the result is exact: it equals the flat ILP's optimum. The outer ILP has no
symmetric copies of identical blocks, so it stays small and fast as the block count grows.

Full frontiers are large (thousands of points per boundary for 8 ops x 10 choices), so they are never
enumerated: `planner.search.solve.lagrange` bounds every partial assignment of a block by the best objective any
answer using it can reach, and the frontier DP drops labels above a target. The target starts just above
the bound; an outer optimum above the target is a true upper bound and becomes the next target, and an
outer optimum at or below its round's target is the global optimum (every point of any better answer was
kept). Typically two or three rounds over a few hundred points.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.search.solve.decompose import Decomposition, decompose
from planner.search.solve.driver import infeasible_or_fallback
from planner.search.solve.evaluate import evaluate_indexed
from planner.search.solve.frontier import FrontierPoint, FrontierTimeout, block_frontier
from planner.search.solve.ilp import ONE, BuiltModel, IlpBuilder, LinExpr
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.lagrange import LagrangeBound, Weights, best_multiplier
from planner.search.solve.milp import LEAN_OPTIONS, NO_PROBING, NODE_LIMIT, MilpResult, resolve_solver, solve_milp
from planner.search.solve.min_budget import LeastMemory
from planner.search.solve.problem import Solution

__all__ = ["TwoLevel", "usable_columns"]


def _trail(arcs: list[tuple[int, int, int]], start: int) -> list[int]:
    """Arc ids of an Eulerian trail from `start` using every arc (p, q, id) once (Hierholzer)."""
    adj: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for p, q, i in reversed(arcs):
        adj[p].append((q, i))
    stack: list[tuple[int, int | None]] = [(start, None)]
    path: list[int] = []
    while stack:
        v, arc = stack[-1]
        if adj[v]:
            stack.append(adj[v].pop())
        else:
            stack.pop()
            if arc is not None:
                path.append(arc)
    if len(path) != len(arcs):
        raise RuntimeError("the chosen block points do not form one walk (internal error)")
    return path[::-1]


@dataclass
class _Round:
    """One outer solve over pruned frontiers: the solver result and, if it found one, the exact value
    (seconds or peak bytes) and peak of its assignment."""

    res: MilpResult
    built: BuiltModel | None
    choice: list[int]
    ckpt: list[int]
    value: float
    peak: int = 0


class TwoLevel:
    """The two-level solve of one problem (see the module docstring).

    `TwoLevel(ip)` raises NotDecomposable when the blocks do not have one port and one output each.
    Frontiers are not enumerated in full: a Lagrangian bound (`planner.search.solve.lagrange`) drops every label
    that cannot be part of an answer better than a target objective. The target starts just above the
    bound; if the outer ILP's optimum over the kept points exceeds the target, that optimum is a true
    upper bound and one more round with it as the target is exact.
    """

    def __init__(self, ip: IndexedProblem, dec: Decomposition | None = None) -> None:
        self.ip = ip
        self.dec: Decomposition = decompose(ip) if dec is None else dec
        self._bound: LagrangeBound | None = None
        self.points: list[list[FrontierPoint]] = [[] for _ in self.dec.classes]
        # node -> the only choices the outer ILP may give it (None: all)
        self.allowed: dict[int, np.ndarray] | None = None
        self.stats: dict[str, float] = {}

    @property
    def bound(self) -> LagrangeBound:
        """The Lagrangian bounds (made on first use: the outer ILP alone does not need them)."""
        if self._bound is None:
            self._bound = LagrangeBound(self.ip, self.dec)
        return self._bound

    def _frontiers(self, mode: str, target: float, deadline: float) -> None:
        self.points = [
            block_frontier(c.shape, checkpointing=self.ip.checkpointing, with_time=mode == "time",
                           prune=self.bound.prune(k, target) if np.isfinite(target) else None, deadline=deadline)
            for k, c in enumerate(self.dec.classes)
        ]
        self.stats["points"] = float(sum(len(p) for p in self.points))

    def _round(self, mode: str, target: float, solver: str, deadline: float, upper: float = np.inf) -> _Round:
        """Frontiers pruned to `target`, the outer ILP, and the exact value of its answer. `upper`: the value
        of an answer already found (the solver may prune anything worse). In time mode an answer that
        may exceed the budget by solver tolerance: `solve` then tightens the budget and solves again."""
        try:
            self._frontiers(mode, target, deadline)
        except FrontierTimeout as err:
            return _Round(MilpResult("error", None, np.nan, np.nan, np.nan, 0.0, solver, str(err)), None, [], [],
                          np.inf)
        return self.outer(mode, solver, deadline, upper)

    def outer(self, mode: str, solver: str, deadline: float, upper: float = np.inf, rel_gap: float = 1e-9,
              node_limit: int | None = NODE_LIMIT, stall_nodes: int | None = None, work_limit: int | None = None
              ) -> _Round:
        """The outer ILP over the current `points` and the exact value of its answer (see `_round`);
        `rel_gap`: the relative gap at which a time-mode solve may stop; `node_limit`: its branch-and-bound
        nodes at most; `stall_nodes`: nodes without a better answer after which it stops; `work_limit`: its
        work at most (`solve_milp`)."""
        built = self.build(mode, self.ip.budget if mode == "time" else None)
        gaps = {"rel_gap": rel_gap} if mode == "time" else {"rel_gap": 0.0, "abs_gap": 0.25 / built.unit}
        slack = 1e-7 * abs(upper) if mode == "time" else 1.0
        res = solve_milp(built.model, solver=solver, time_limit=deadline - time.perf_counter(),
                         cutoff=(upper + slack) * built.scale, node_limit=node_limit, stall_nodes=stall_nodes,
                         work_limit=work_limit,
                         options=(LEAN_OPTIONS | NO_PROBING) if mode == "time" else LEAN_OPTIONS, **gaps)
        if res.x is None:
            return _Round(res, built, [], [], np.inf)
        choice, ckpt = built.extract(res.x)
        time_s, peak, _ = evaluate_indexed(self.ip, choice, ckpt)
        return _Round(res, built, choice, ckpt, time_s if mode == "time" else float(peak), peak)

    def _exact(self, mode: str, lower: float, solver: str, deadline: float,
               on_infeasible: Callable[[], bool] | None = None) -> tuple[_Round, float, bool]:
        """Rounds until the best answer is proven optimal or the solver stops early. Returns the round of
        the best answer (or the last round when there is none), a valid lower bound on the optimum and
        whether the answer is proven optimal. on_infeasible() is asked once when a pruned round has no
        answer and none was found yet: False stops."""
        span = max(abs(lower) * 1e-4, 1.0 if mode == "memory" else 1e-12)
        target = lower + span if np.isfinite(lower) else np.inf
        best: _Round | None = None
        floor = lower  # proven lower bound on the optimum
        asked = False
        self.stats["rounds"] = 0
        while True:
            self.stats["rounds"] += 1
            upper = best.value if best is not None else np.inf
            rnd = self._round(mode, target, solver, deadline, upper)
            tol = 1e-9 * abs(target) if mode == "time" else 0.0
            finished = rnd.res.status in ("optimal", "infeasible")  # the round's ILP was solved to the end
            if rnd.res.x is not None and rnd.value < upper:
                best = rnd
            if rnd.res.x is not None and rnd.res.status == "optimal" and rnd.value <= target + tol:
                return rnd, rnd.value, True  # every point of any better answer was in this round
            if finished and best is not None and target >= best.value - tol:
                return best, best.value, True  # nothing at or below the target beats the best answer
            if not finished:  # time limit
                bound = rnd.res.bound / rnd.built.scale if rnd.built and np.isfinite(rnd.res.bound) else lower
                return (best if best is not None else rnd), max(floor, min(bound, target)), False
            floor = max(floor, target)  # no answer at or below this target exists
            if rnd.res.status == "infeasible" and best is None:
                if not np.isfinite(target):
                    return rnd, lower, True
                # wide targets are costly: first make sure some assignment fits at all
                if not asked and on_infeasible is not None and span >= 1e-2 * abs(lower):
                    asked = True
                    if not on_infeasible():
                        return rnd, lower, True
            span *= 4 if best is not None else 16
            reach = lower + span if span < 1e3 * max(abs(lower), 1e-12) else np.inf
            target = min(best.value, reach) if best is not None else reach

    def least(self, solver: str, deadline: float) -> LeastMemory:
        """The least peak memory over all assignments (proven exact unless the time limit hits)."""
        lower = self.bound.evaluate(Weights(0.0, 1.0, 0.0), keep=True)
        rnd, _, proven = self._exact("memory", lower, solver, deadline)
        if rnd.res.x is None:
            return LeastMemory(None, [], [], False, f"least-memory solve failed: {rnd.res.message}".strip())
        message = "" if proven else f"smallest feasible budget {int(rnd.value)} B is an upper bound (not proven)"
        return LeastMemory(int(rnd.value), rnd.choice, rnd.ckpt, proven, message)

    def solve(self, solver: str, deadline: float) -> Solution:
        """The fastest assignment under the budget, as a Solution (method "two_level"); `deadline`: a
        time.perf_counter() value where the user's time limit stops it (inf: none)."""
        start = time.perf_counter()
        ip = self.ip
        if self.bound.evaluate(Weights(0.0, 1.0, 0.0)) > ip.budget:  # even the least memory exceeds the budget
            base = dict(seconds=0.0, solver=resolve_solver(solver), method="two_level")
            answer = infeasible_or_fallback(ip, self.least(solver, deadline), base)
            answer.seconds = time.perf_counter() - start
            return answer
        mu = best_multiplier(self.bound, ip.budget)
        lower = self.bound.evaluate(Weights(1.0, mu, mu * ip.budget), keep=True)
        self.stats.update(mu=mu, lower=lower)
        least: list[LeastMemory] = []

        def still_feasible() -> bool:
            least.append(self.least(solver, deadline))
            fits = least[0].peak_bytes is not None and least[0].peak_bytes <= ip.budget
            if fits:  # the memory rounds replaced the bound's weights: restore them
                self.bound.evaluate(Weights(1.0, mu, mu * ip.budget), keep=True)
            return fits

        rnd, floor, proven = self._exact("time", lower, solver, deadline, still_feasible)
        seconds = time.perf_counter() - start
        if rnd.res.x is not None:
            gap = 0.0 if proven else max(0.0, (rnd.value - floor) / abs(rnd.value)) if rnd.value else 0.0
            return Solution(
                status="optimal" if proven else "feasible", choice=dict(zip(ip.names, rnd.choice)),
                checkpointed=[ip.block_names[b] for b in rnd.ckpt], objective=rnd.value, gap=gap, seconds=seconds,
                solver=rnd.res.solver, peak_bytes=evaluate_indexed(ip, rnd.choice, rnd.ckpt)[1], method="two_level",
                bound=rnd.value if proven else floor,
                message="" if proven else "stopped at a node or time limit before the answer was proven optimal",
            )
        if rnd.res.status == "infeasible":
            if not least:
                least.append(self.least(solver, deadline))
            base = dict(seconds=time.perf_counter() - start, solver=rnd.res.solver, method="two_level")
            return infeasible_or_fallback(ip, least[0], base)
        message = rnd.res.message or f"solver status {rnd.res.status}"
        return Solution(status="error", seconds=seconds, solver=rnd.res.solver, method="two_level",
                        message=f"{message}; no assignment found within the solver's limits: raise time_limit")

    def build(self, mode: str, budget: int | None) -> BuiltModel:
        """The outer ILP (see the module docstring) over `self.points` for mode "time" or "memory"."""
        ip, dec = self.ip, self.dec
        b = IlpBuilder(ip)
        s = {v: b.one_hot(ip.sizes[v]) for v in dec.outer_nodes}
        for v in dec.outer_nodes:
            b.time.add(s[v], ip.time[v])
            b.memory.add(s[v], ip.state[v] + ip.saved[v])
            b.top(s[v], ip.transient[v].astype(float))
        ends = {seg.out: b.one_hot(ip.sizes[seg.out]) for seg in dec.segments if seg.out is not None}
        for v, vec in list(s.items()) + list(ends.items()):
            if self.allowed is not None and v in self.allowed and vec[0] != ONE:
                b.model.fix_zero(np.delete(vec, self.allowed[v]))

        def ind(u: int | None) -> np.ndarray:
            return np.array([ONE]) if u is None else (s[u] if u in s else ends[u])

        for e in ip.edges:
            if ip.block_of[e.dst] < 0:
                b.pair_cost(ind(e.src), s[e.dst], e.cost, b.time)
                b.pair_top(ind(e.src), s[e.dst], e.transient)
                if e.saved is not None:
                    b.pair_cost(ind(e.src), s[e.dst], e.saved.astype(float), b.memory)
        levels: dict[int, int] = {}
        counts = []
        for seg in dec.segments:
            counts.append(self._segment(b, seg.blocks, self.points[seg.cls], ind(seg.port),
                                        ind(seg.out) if seg.out is not None else None, levels))
        for v, nbytes, blocks in ip.shared:
            # kept while any of its segments has a checkpointed block (a segment only partly reading it
            # counts as reading it: at most an over-count, never an answer over the budget)
            shares = []
            for seg, n in zip(dec.segments, counts):
                if blocks.intersection(seg.blocks):
                    ck = [i for i, pt in enumerate(self.points[seg.cls]) if pt.ckpt]
                    if ck:
                        share = LinExpr()
                        share.add(n[ck], 1.0 / len(seg.blocks))
                        shares.append(share)
            if v in s or v in ends:
                b.kept_while(ind(v), nbytes, shares)
            else:  # made inside a block: its largest size
                b.kept_while(np.array([ONE]), nbytes.max(keepdims=True), shares)
        model = b.finish(mode, budget)
        points = self.points

        def extract(x: np.ndarray) -> tuple[list[int], list[int]]:
            choice = [0] * ip.n
            for v, vec in s.items():
                choice[v] = 0 if vec[0] == ONE else int(np.argmax(x[vec]))
            ckpt = []
            for seg, n in zip(dec.segments, counts):
                pts = points[seg.cls]
                port = ind(seg.port)
                start = 0 if port[0] == ONE else int(np.argmax(x[port]))
                arcs = [(pts[i].p, pts[i].q, i) for i in range(len(pts)) for _ in range(int(round(x[n[i]])))]
                for blk, i in zip(seg.blocks, _trail(arcs, start)):
                    for v, c in zip(ip.block_nodes[blk], pts[i].choice):
                        choice[v] = c
                    if pts[i].ckpt:
                        ckpt.append(blk)
            return choice, sorted(ckpt)

        return BuiltModel(model, b.unit, extract, b.scale)

    def _segment(self, b: IlpBuilder, blocks: list[int], pts: list[FrontierPoint], start: np.ndarray,
                 end: np.ndarray | None, levels: dict[int, int]) -> np.ndarray:
        """Count variables and rows of one segment; returns the count variables (one per point)."""
        m = len(blocks)
        n = b.model.add_vars(len(pts), lb=0.0, ub=float(m), integer=True)
        b.model.add_row(n, np.ones(len(pts)), m, m)
        if not pts:
            return n
        p = np.array([pt.p for pt in pts])
        q = np.array([pt.q for pt in pts])
        b.time.add(n, np.array([pt.time_s for pt in pts]))
        b.memory.add(n, np.array([pt.add_bytes for pt in pts], dtype=float))
        tops = np.array([pt.max_bytes for pt in pts])
        average = LinExpr()  # valid: T >= the mean max-term bytes of the segment's blocks
        average.add(n, tops / m)
        b.tops.append((average, float(tops.max())))
        for level in np.unique(tops[tops > 0]):
            if int(level) not in levels:
                lam = int(b.model.add_vars(1, integer=True)[0])
                levels[int(level)] = lam
                expr = LinExpr()
                expr.add(np.array([lam]), float(level))
                b.tops.append((expr, float(level)))
            use = n[tops == level]
            b.model.add_row(np.concatenate([use, [levels[int(level)]]]),
                            np.concatenate([np.ones(len(use)), [-float(m)]]), hi=0.0)
        size = len(start)
        for v in range(size):
            row = LinExpr()
            row.add(n[p == v], 1.0)
            row.add(start[v:v + 1], -1.0)
            if m > 1:
                row.add(n[q == v], -1.0)
                row.add(end[v:v + 1], 1.0)
            b.add_expr_row(row, 0.0, 0.0)
        if m == 1 and end is not None:
            for v in range(len(end)):
                row = LinExpr()
                row.add(n[q == v], 1.0)
                row.add(end[v:v + 1], -1.0)
                b.add_expr_row(row, 0.0, 0.0)
        if m > 1 and size > 1:
            self._connect(b, n, p, q, start, m)
        return n

    @staticmethod
    def _connect(b: IlpBuilder, n: np.ndarray, p: np.ndarray, q: np.ndarray, start: np.ndarray, m: int) -> None:
        """Flow rows making every used arc's head reachable from the start choice over used arcs."""
        size = len(start)
        flow: dict[tuple[int, int], int] = {}
        for a, c in {(int(x), int(y)) for x, y in zip(p, q) if x != y}:
            f = int(b.model.add_vars(1)[0])
            flow[(a, c)] = f
            on_arc = n[(p == a) & (q == c)]
            b.model.add_row(np.concatenate([[f], on_arc]), np.concatenate([[1.0], -np.ones(len(on_arc))]), hi=0.0)
        supply = b.model.add_vars(size)
        for v in range(size):
            cap = LinExpr()
            cap.add(supply[v:v + 1], 1.0)
            cap.add(start[v:v + 1], -1.0)
            b.add_expr_row(cap, hi=0.0)
            bal = LinExpr()
            bal.add(np.array([f for (a, c), f in flow.items() if c == v], dtype=np.int64), 1.0)
            bal.add(np.array([f for (a, c), f in flow.items() if a == v], dtype=np.int64), -1.0)
            bal.add(n[q == v], -1.0 / m)
            bal.add(supply[v:v + 1], 1.0)
            b.add_expr_row(bal, 0.0, 0.0)


def usable_columns(ip: IndexedProblem, dec: Decomposition, points: list[list[FrontierPoint]],
                   allowed: dict[int, np.ndarray], upper: float) -> list[list[FrontierPoint]]:
    """The columns that can be part of an answer that fits the budget and beats `upper` (seconds).

    With every other block at its class's least additive bytes (resp. least time) and every outer node
    at its least, a column whose own bytes plus its max term still exceed the budget, or whose own
    time makes the step no faster than `upper`, is in no such answer: dropped (exact, not a heuristic).
    At tight budgets most columns are fast blocks that need more memory than is left; without them the
    ILP is a fraction of the size. Repeated while it drops columns (the bounds rise as columns go)."""
    outer_add = outer_time = outer_top = 0.0
    for v in dec.outer_nodes:
        opts = allowed.get(v, np.arange(ip.sizes[v]))
        outer_add += float((ip.state[v] + ip.saved[v])[opts].min())
        outer_time += float(ip.time[v][opts].min())
        outer_top = max(outer_top, float(ip.transient[v][opts].min()))
    count = [0] * len(points)
    for seg in dec.segments:
        count[seg.cls] += len(seg.blocks)
    while True:
        if any(not pts for pts, m in zip(points, count) if m):
            return points
        least_add = [min((pt.add_bytes for pt in pts), default=0) for pts in points]
        least_time = [min((pt.time_s for pt in pts), default=0.0) for pts in points]
        add = outer_add + sum(m * x for m, x in zip(count, least_add))
        secs = outer_time + sum(m * x for m, x in zip(count, least_time))
        kept = [[pt for pt in pts
                 if add - least_add[k] + pt.add_bytes + max(pt.max_bytes, outer_top) <= ip.budget
                 and secs - least_time[k] + pt.time_s < upper * (1 + 1e-9)]
                for k, pts in enumerate(points)]
        if sum(map(len, kept)) == sum(map(len, points)):
            return kept
        points = kept
