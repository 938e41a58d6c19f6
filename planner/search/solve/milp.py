"""A small sparse MILP container and the two back ends that solve it: HiGHS (highspy) and CBC (PuLP).

The ILP builders write variables and rows into a `MilpModel` with numpy index arrays; `solve_milp` hands
the whole matrix to HiGHS in one call (building a 200,000-variable model through PuLP's expression
objects takes longer than solving it) or, for CBC, translates it into a `pulp.LpProblem`. When highspy
is missing, "highs" falls back to CBC with a logged warning.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from cost_models.errors import PlannerError

__all__ = ["HIGHS_THREADS", "LEAN_OPTIONS", "NODE_LIMIT", "NO_PROBING", "WORK_LIMIT", "SolverError", "MilpModel", "MilpResult", "Progress", "solve_milp", "resolve_solver"]

log = logging.getLogger(__name__)

SOLVERS = ("highs", "cbc")
# Branch-and-bound nodes one MILP may explore. Limits are counted in work, never in seconds, so that an
# answer does not depend on how busy the machine is (a plan is a function of its inputs); a wall-clock
# `time_limit` is only applied when the user asks for one.
NODE_LIMIT = 20_000
# A node limit does not bound the work on a large model: its root node alone (LP, cut rounds, heuristics)
# can take minutes (HF T5 on 2x2x2: 152k variables). HiGHS checks for interruption at fixed points of its
# search (after each cut round, node, heuristic), each costing about one pass over the model, so the work
# is bounded by allowing WORK_LIMIT / nonzeros such checkpoints (at least _MIN_CHECKS): a count, so the
# answer is still a function of the model. About 100 checkpoints for an 11k-variable model, 10 for T5's.
WORK_LIMIT = 4_000_000
# HiGHS options for the column ILPs (`two_level`): a handful of branch-and-bound nodes each, where its
# RINS/RENS sub-MIPs and its restarts after root fixings are most of the work. On hf-bert's 2x2x2 mixed
# column ILP (17,435 columns, time mode with the priced answer as cutoff) 31 s -> 12 s, and its
# least-memory ILP (17,689 columns, no cutoff) 7.3 s -> 3.9 s; the answers are the same.
LEAN_OPTIONS = {"mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False, "mip_allow_restart": False}
# ... and for the column ILPs that minimise time, no probing in presolve (rule 15 of presolve_rule_off): on
# the mixed ILPs of the priced search it was most of the work (gpt2-small 64 ranks, 4x4x4 at 1.25x its
# smallest budget, 14k columns: 10.8 -> 1.0 s, the same optimum; gpt3-175b 2x2x2 at 2x: node limit after
# 10.5 s -> optimal in 3.1 s, a faster answer; of seven saved ILPs one slower, HF BERT's 2x2x2: 4.9 -> 6.2 s).
NO_PROBING = {"presolve_rule_off": 1 << 15}
_MIN_CHECKS = 10
# Threads every HiGHS solve runs on. HiGHS picks its count from the machine's cores by default, and its search
# (the nodes it explores, so the answer a work limit leaves) follows the count: HF Qwen2's proving ILP on 4x4x4
# (`fixing.prove`) explores 85 nodes with 2 threads, 88 with 4, 105 with 1. Fixed, the answer is the same on a
# laptop, a CI runner and a 64-core node. Two: what HiGHS used on the 2-core machines the limits were set on.
HIGHS_THREADS = 2


class SolverError(PlannerError, ValueError):
    """An unknown solver name or solve option."""


@dataclass
class MilpResult:
    """status: "optimal" | "feasible" (limit hit with a solution) | "infeasible" | "error".
    objective and bound include the model's constant offset; gap is relative (nan when unknown)."""

    status: str
    x: np.ndarray | None
    objective: float
    bound: float
    gap: float
    seconds: float
    solver: str
    message: str = ""
    nodes: int = 0  # branch-and-bound nodes HiGHS explored (0 when unknown)
    work_limited: bool = False  # the work limit stopped it (solving again with a tighter row costs as much)


class MilpModel:
    """Minimise cost·x + offset subject to lo <= A x <= hi and bounds; some variables integer."""

    def __init__(self) -> None:
        self._lb: list[np.ndarray] = []
        self._ub: list[np.ndarray] = []
        self._int: list[np.ndarray] = []
        self._cost_idx: list[np.ndarray] = []
        self._cost_val: list[np.ndarray] = []
        self._row_idx: list[np.ndarray] = []
        self._row_val: list[np.ndarray] = []
        self._row_lo: list[float] = []
        self._row_hi: list[float] = []
        self.num_vars = 0
        self.offset = 0.0
        self.trivially_infeasible = False
        self._zero: list[np.ndarray] = []

    @property
    def num_rows(self) -> int:
        return len(self._row_lo)

    def add_vars(self, n: int, lb: float = 0.0, ub: float = 1.0, integer: bool = False) -> np.ndarray:
        """Add n variables with the same bounds; returns their indices."""
        idx = np.arange(self.num_vars, self.num_vars + n)
        self.num_vars += n
        self._lb.append(np.full(n, lb, dtype=float))
        self._ub.append(np.full(n, ub, dtype=float))
        self._int.append(np.full(n, integer, dtype=bool))
        return idx

    def fix_zero(self, idx: np.ndarray) -> None:
        """Fix variables idx to 0 (upper bound 0): options ruled out before the solve."""
        self._zero.append(np.asarray(idx, dtype=np.int64))

    def add_cost(self, idx: np.ndarray, coef: np.ndarray) -> None:
        """Add coef[i] to the objective coefficient of variable idx[i] (repeats accumulate)."""
        self._cost_idx.append(np.asarray(idx, dtype=np.int64))
        self._cost_val.append(np.asarray(coef, dtype=float))

    def add_row(self, idx: np.ndarray, coef: np.ndarray, lo: float = -np.inf, hi: float = np.inf) -> None:
        """Add lo <= sum coef[i]·x[idx[i]] <= hi (duplicate indices are summed). A row without variables
        is checked at once and marks the model infeasible when 0 is outside [lo, hi]."""
        idx = np.asarray(idx, dtype=np.int64)
        coef = np.asarray(coef, dtype=float)
        keep = coef != 0
        idx, coef = idx[keep], coef[keep]
        if len(idx) == 0:
            if lo > 1e-9 or hi < -1e-9:
                self.trivially_infeasible = True
            return
        uniq, inv = np.unique(idx, return_inverse=True)
        self._row_idx.append(uniq)
        self._row_val.append(np.bincount(inv, weights=coef, minlength=len(uniq)))
        self._row_lo.append(lo)
        self._row_hi.append(hi)

    def arrays(self) -> dict[str, np.ndarray]:
        """The model as dense bound/cost vectors and a CSR row matrix."""
        cost = np.zeros(self.num_vars)
        if self._cost_idx:
            np.add.at(cost, np.concatenate(self._cost_idx), np.concatenate(self._cost_val))
        lengths = [len(i) for i in self._row_idx]
        ub = np.concatenate(self._ub) if self._ub else np.zeros(0)
        if self._zero:
            ub[np.concatenate(self._zero)] = 0.0
        return {
            "cost": cost,
            "lb": np.concatenate(self._lb) if self._lb else np.zeros(0),
            "ub": ub,
            "integer": np.concatenate(self._int) if self._int else np.zeros(0, dtype=bool),
            "row_lo": np.array(self._row_lo, dtype=float),
            "row_hi": np.array(self._row_hi, dtype=float),
            "start": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
            "index": np.concatenate(self._row_idx).astype(np.int32) if lengths else np.zeros(0, np.int32),
            "value": np.concatenate(self._row_val) if lengths else np.zeros(0),
        }


class Progress:
    """Progress on stderr for work that lasts longer than `delay_s`: a rich spinner with the elapsed
    seconds on a terminal, otherwise one line when the delay passes and one when the work ends.

    Used as a context manager; `update(text)` changes the label. Does nothing when not enabled.
    """

    def __init__(self, enabled: bool, text: str = "solving", delay_s: float = 1.0) -> None:
        self.enabled = enabled
        self.text = text
        self.delay_s = delay_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False
        self._start = 0.0

    def update(self, text: str) -> None:
        self.text = text

    def _elapsed(self) -> str:
        return f"{time.perf_counter() - self._start:.1f} s"

    def _run(self) -> None:
        if self._stop.wait(self.delay_s):
            return
        self._shown = True
        if not sys.stderr.isatty():
            print(f"{self.text} ... (running)", file=sys.stderr, flush=True)
            return
        from rich.console import Console

        with Console(stderr=True).status(self.text) as status:
            while not self._stop.wait(0.2):
                status.update(f"{self.text} [{self._elapsed()}]")

    def __enter__(self) -> Progress:
        if self.enabled:
            self._start = time.perf_counter()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join()
        if self._shown:
            print(f"{self.text} ... done in {self._elapsed()}", file=sys.stderr, flush=True)


def resolve_solver(solver: str) -> str:
    """The back end that will run: "highs" when highspy imports, else "cbc" (with a warning)."""
    if solver not in SOLVERS:
        raise SolverError(f"unknown solver {solver!r}; use one of {SOLVERS}")
    if solver == "highs":
        try:
            import highspy  # noqa: F401
        except ImportError:
            log.warning("highspy is not installed; falling back to CBC (pip install highspy for HiGHS)")
            return "cbc"
    return solver


def solve_milp(
    model: MilpModel, *, solver: str = "highs", time_limit: float | None = None, rel_gap: float = 1e-9,
    abs_gap: float = 0.0, cutoff: float = np.inf, node_limit: int | None = NODE_LIMIT,
    work_limit: int | None = None, mip_start: dict[int, float] | None = None, options: Mapping[str, object] | None = None,
    stall_nodes: int | None = None,
) -> MilpResult:
    """Solve `model` with the named back end ("highs" or "cbc"). `node_limit`: branch-and-bound nodes at
    most (work, so the answer is reproducible); `work_limit`: with HiGHS, stop after work_limit / nonzeros
    of its interruption checkpoints (see WORK_LIMIT; None: no such limit); `time_limit`: seconds (None or
    inf: none, the default; a finite one makes the answer depend on the machine's speed). `cutoff`: an
    objective value known to be reachable (HiGHS prunes every branch that cannot beat it). `mip_start`:
    values of (some of) the integer variables of a known solution (a MIP start, HiGHS only; it completes
    the rest), so a limit that stops the search early still returns at least that solution. `options`: more
    HiGHS options (LEAN_OPTIONS, NO_PROBING; CBC ignores them). `stall_nodes`: with HiGHS, stop once that
    many branch-and-bound nodes passed since the last better solution (counted from the first one found:
    a search that stalls there seldom improves later; work, so still reproducible)."""
    name = resolve_solver(solver)
    if model.trivially_infeasible:
        return MilpResult("infeasible", None, np.nan, np.nan, np.nan, 0.0, name)
    if model.num_vars == 0:
        return MilpResult("optimal", np.zeros(0), model.offset, model.offset, 0.0, 0.0, name)
    start = time.perf_counter()
    seconds = None if time_limit is None or not np.isfinite(time_limit) else max(float(time_limit), 0.01)
    if name == "highs":
        result = _solve_highs(model, seconds, rel_gap, abs_gap, cutoff, node_limit, work_limit, mip_start, options,
                              stall_nodes)
    else:
        result = _solve_cbc(model, seconds, rel_gap, abs_gap, node_limit)
    result.seconds = time.perf_counter() - start
    return result


_BANNER_SHOWN = False


def _quiet_highs() -> object:
    """A silent highspy.Highs. The first one prints a licence banner on stdout from C++ before options can
    be set; stdout's file descriptor is pointed at /dev/null while it is made."""
    import os
    import sys

    import highspy

    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            _BANNER_SHOWN = True
    h.setOptionValue("output_flag", False)
    return h


def _checkpoint_limit(h: object, checks: int | None, stall_nodes: int | None) -> list[int]:
    """Interrupt HiGHS at its `checks`-th interruption checkpoint, or at the first checkpoint `stall_nodes`
    branch-and-bound nodes after its last better solution; returns [checkpoints seen, 1 if it stalled]."""
    seen = [0, 0]
    best = [np.inf, 0]  # the best solution's objective (inf until one is found: not the cutoff) and its node

    def interrupt(event: object) -> None:
        seen[0] += 1
        if checks is not None and seen[0] >= checks:
            event.interrupt()
        if stall_nodes is None:
            return
        found, node = float(event.data_out.objective_function_value), int(event.data_out.mip_node_count)
        if found < best[0] - 1e-12 * abs(found):
            best[:] = [found, node]
        elif np.isfinite(best[0]) and node - best[1] >= stall_nodes:
            seen[1] = 1
            event.interrupt()

    if checks is not None or stall_nodes is not None:
        h.cbMipInterrupt += interrupt
    return seen


def _solve_highs(model: MilpModel, time_limit: float | None, rel_gap: float, abs_gap: float, cutoff: float,
                 node_limit: int | None, work_limit: int | None = None,
                 mip_start: dict[int, float] | None = None, options: Mapping[str, object] | None = None,
                 stall_nodes: int | None = None) -> MilpResult:
    import highspy

    a = model.arrays()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = model.num_vars, model.num_rows
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = a["cost"], a["lb"], a["ub"]
    lp.row_lower_, lp.row_upper_ = a["row_lo"], a["row_hi"]
    lp.offset_ = model.offset
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = model.num_vars, model.num_rows
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a["start"], a["index"], a["value"]
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in a["integer"]]
    h = _quiet_highs()
    if time_limit is not None:
        h.setOptionValue("time_limit", time_limit)
    if node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(node_limit))
    h.setOptionValue("mip_rel_gap", float(rel_gap))
    h.setOptionValue("mip_abs_gap", float(abs_gap))
    h.setOptionValue("primal_feasibility_tolerance", 1e-9)
    h.setOptionValue("mip_feasibility_tolerance", 1e-9)
    h.setOptionValue("threads", HIGHS_THREADS)
    if np.isfinite(cutoff):
        h.setOptionValue("objective_bound", float(cutoff))
    for option, value in (options or {}).items():
        h.setOptionValue(option, value)
    h.passModel(lp)
    if mip_start:
        idx = np.array(sorted(mip_start), dtype=np.int32)
        h.setSolution(len(idx), idx, np.array([mip_start[i] for i in idx], dtype=float))
    checks = None if work_limit is None else max(_MIN_CHECKS, work_limit // max(len(a["value"]), 1))
    seen = _checkpoint_limit(h, checks, stall_nodes)
    h.HandleKeyboardInterrupt = True  # solve in a thread: Ctrl-C works and a progress spinner keeps turning
    h.solve()
    status = h.getModelStatus()
    info = h.getInfo()
    has_x = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.asarray(h.getSolution().col_value) if has_x else None
    obj = info.objective_function_value if has_x else np.nan
    bound, gap, nodes = info.mip_dual_bound, info.mip_gap, max(int(info.mip_node_count), 0)
    S = highspy.HighsModelStatus
    if status == S.kOptimal:
        return MilpResult("optimal", x, obj, bound, 0.0 if gap < rel_gap else gap, 0.0, "highs", nodes=nodes)
    if status == S.kInfeasible or (status == S.kObjectiveBound and not has_x):  # nothing beats the cutoff
        return MilpResult("infeasible", None, np.nan, bound, np.nan, 0.0, "highs", nodes=nodes)
    reason = h.modelStatusToString(status)
    limited = checks is not None and seen[0] >= checks
    if limited:
        reason = f"work limit ({checks} solver checkpoints for {len(a['value'])} nonzeros)"
    elif seen[1]:
        reason = f"no better solution in {stall_nodes} nodes"
    if has_x:
        return MilpResult("feasible", x, obj, bound, gap, 0.0, "highs", f"HiGHS stopped: {reason}", nodes, limited)
    return MilpResult("error", None, np.nan, bound, np.nan, 0.0, "highs", f"HiGHS stopped without a solution: {reason}",
                      nodes, limited)


def _solve_cbc(model: MilpModel, time_limit: float | None, rel_gap: float, abs_gap: float,
               node_limit: int | None) -> MilpResult:
    import pulp

    a = model.arrays()
    prob = pulp.LpProblem("planner", pulp.LpMinimize)
    def bound(v: float) -> float | None:
        return float(v) if np.isfinite(v) else None  # PuLP spells "unbounded" None

    xs = [
        prob.add_variable(f"x{i}", lowBound=bound(lo), upBound=bound(hi),
                          cat=pulp.LpInteger if integer else pulp.LpContinuous)
        for i, (lo, hi, integer) in enumerate(zip(a["lb"], a["ub"], a["integer"]))
    ]
    nz = np.nonzero(a["cost"])[0]
    prob += pulp.LpAffineExpression([(xs[i], float(a["cost"][i])) for i in nz]) + model.offset
    for r in range(model.num_rows):
        lo, hi = a["row_lo"][r], a["row_hi"][r]
        sl = slice(a["start"][r], a["start"][r + 1])
        expr = pulp.LpAffineExpression([(xs[i], float(v)) for i, v in zip(a["index"][sl], a["value"][sl])])
        if lo == hi:
            prob += expr == float(lo)
            continue
        if np.isfinite(lo):
            prob += expr >= float(lo)
        if np.isfinite(hi):
            prob += expr <= float(hi)
    options = dict(msg=False, timeLimit=time_limit, gapRel=rel_gap, gapAbs=abs_gap, maxNodes=node_limit)
    if pulp.COIN_CMD(msg=False).available():  # a system CBC (pip install pulp[cbc]): PuLP 4's way
        cmd = pulp.COIN_CMD(**options)
    else:
        with warnings.catch_warnings():  # PuLP 3.3 deprecates its bundled CBC but still ships it
            warnings.simplefilter("ignore", DeprecationWarning)
            cmd = pulp.PULP_CBC_CMD(**options)
    prob.solve(cmd)
    if prob.status == pulp.LpStatusInfeasible:
        return MilpResult("infeasible", None, np.nan, np.nan, np.nan, 0.0, "cbc")
    if prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        x = np.array([v.varValue if v.varValue is not None else 0.0 for v in xs])
        obj = float(a["cost"] @ x) + model.offset
        if prob.sol_status == pulp.LpSolutionOptimal:
            return MilpResult("optimal", x, obj, obj, 0.0, 0.0, "cbc")
        return MilpResult("feasible", x, obj, np.nan, np.nan, 0.0, "cbc", "CBC stopped at its node or time limit")
    return MilpResult("error", None, np.nan, np.nan, np.nan, 0.0, "cbc", f"CBC: {pulp.LpStatus[prob.status]}")
