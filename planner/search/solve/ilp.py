"""The flat ILP (after Alpa, DESIGN §6): one one-hot vector per node, pair variables per costly edge,
one checkpoint binary per block, a memory row with a max term, time in the objective.

Formulation (memory in units of `IndexedProblem.memory_unit()` bytes, time scaled to ~1e3):

* s_v[p] binary, sum_p s_v[p] = 1; nodes with one choice are the constant 1 (no variable).
* Edge matrices that split as a[p] + b[q] (constant ones, ones with a single-choice end) are folded into
  the two nodes' costs. Other edges get e[p, q] in [0, 1] with sum_q e[p, q] = s_u[p] and
  sum_p e[p, q] = s_v[q]: with integer s the only solution is e = s_u s_vᵀ, so e stays continuous. One
  set of pair variables per edge carries all its terms (time, working set, saved bytes). A pair ruled out
  in advance (`build_flat(allowed=)`) gets no variable, so the marginals forbid it.
* Checkpoint c_b binary. Every product "node v takes p and block b is checkpointed" is an and-vector
  y[p] in [0, 1] with y[p] <= s_v[p] and sum_p y[p] = c_b: exact for integer s and c (y = c·s). It drops
  v's saved bytes (-saved·y), adds its recompute time, keeps the input node's input_bytes, and gives the
  recompute peak T >= sum_{u in b, u <= v} saved_u·y_u + transient_v·y_v for each v in b (and the same
  with each conversion into v). Edges into or inside b pay their recompute matrix on pair variables built
  from the two and-vectors in the same way as plain edges.
* A shared input gets a binary k >= c_b for each block b that reads it, and adds its bytes on the
  and-vector of its node's one-hot and k.
* T >= sum_p transient_v[p]·s_v[p] for every node, T >= sum_{p,q} transient_e[p, q]·e[p, q] for every edge
  whose conversions need memory (pair variables as above); memory = state + saved - dropped + kept + T <= budget.
* With `held=True`, T >= each `Problem.held_beside` row too: an op's working set plus the gradients the backward
  holds beside it, on their producers' one-hots (and pair variables), at a recomputation on the block's
  and-vectors (`_held_rows`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.milp import MilpModel

__all__ = ["ONE", "ZERO", "LinExpr", "IlpBuilder", "BuiltModel", "build_flat", "flat_pairs", "flat_size"]

ONE = -1  # an indicator entry that is the constant 1 rather than a variable
ZERO = -2  # a pair variable's entry that is the constant 0: a pair of choices ruled out (`pair_vars`)


class LinExpr:
    """A linear expression over model variables plus a constant; indices equal to ONE add constants, indices
    equal to ZERO nothing."""

    def __init__(self) -> None:
        self.idx: list[np.ndarray] = []
        self.val: list[np.ndarray] = []
        self.const = 0.0

    def add(self, ind: np.ndarray, coef: np.ndarray | float) -> None:
        ind = np.asarray(ind, dtype=np.int64)
        coef = np.broadcast_to(np.asarray(coef, dtype=float), ind.shape)
        const = ind == ONE
        self.const += float(coef[const].sum())
        var = ~const & (ind != ZERO)
        self.idx.append(ind[var])
        self.val.append(coef[var])

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.idx:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return np.concatenate(self.idx), np.concatenate(self.val)


def _split(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(a, b) with mat[p, q] == a[p] + b[q] (to 1e-12 relative), or None when the matrix does not split."""
    a = mat[:, 0].copy()
    b = mat[0, :] - mat[0, 0]
    scale = float(np.max(np.abs(mat))) if mat.size else 0.0
    if np.all(np.abs(a[:, None] + b[None, :] - mat) <= 1e-12 * scale):
        return a, b
    return None


@dataclass
class BuiltModel:
    """A model ready to solve, its memory unit, and how to read (choice vector, checkpointed blocks) back."""

    model: MilpModel
    unit: int
    extract: Callable[[np.ndarray], tuple[list[int], list[int]]]
    scale: float = 1.0  # model objective units per second (time mode) or per byte (memory mode)
    # (choice vector, checkpointed blocks) -> values of the integer variables: a MIP start (None: not offered)
    encode: Callable[[list[int], list[int]], dict[int, float]] | None = None


class IlpBuilder:
    """Shared pieces of the flat ILP and the two-level outer ILP: one-hot vectors, and-vectors, pair
    costs, the max term T and the memory row / objective."""

    def __init__(self, ip: IndexedProblem) -> None:
        self.ip = ip
        self.model = MilpModel()
        self.time_scale = 1e3 / ip.time_magnitude()
        self.unit = ip.memory_unit()
        self.time = LinExpr()  # seconds
        self.memory = LinExpr()  # bytes, without the max term
        self.tops: list[tuple[LinExpr, float]] = []  # T >= expr (bytes), with an upper bound of expr
        self.top_floor = 0.0  # T >= this constant
        self._pairs: dict[tuple[bytes, bytes, bytes], np.ndarray] = {}  # pair_vars by their vectors and mask

    def one_hot(self, n: int) -> np.ndarray:
        """An indicator vector choosing exactly one of n options (the constant [ONE] when n == 1)."""
        if n == 1:
            return np.array([ONE])
        ind = self.model.add_vars(n, integer=True)
        self.model.add_row(ind, np.ones(n), 1.0, 1.0)
        return ind

    def and_vector(self, ind: np.ndarray, flag: int) -> np.ndarray:
        """y[p] = ind[p]·flag (flag a binary variable), exact when ind is one-hot and integer."""
        if len(ind) == 1 and ind[0] == ONE:
            return np.array([flag])
        y = self.model.add_vars(len(ind))
        for p in range(len(ind)):
            self.model.add_row([y[p], ind[p]], [1.0, -1.0], hi=0.0)
        self.model.add_row(np.concatenate([y, [flag]]), np.concatenate([np.ones(len(y)), [-1.0]]), 0.0, 0.0)
        return y

    def kept_while(self, ind: np.ndarray, nbytes: np.ndarray, any_of: list[LinExpr]) -> None:
        """memory += nbytes[p]·ind[p]·y, y a binary at least each expression of `any_of` (a block's checkpoint
        flag, or the share of a segment's blocks checkpointed): a shared input, kept while any is."""
        if not any_of or not np.any(nbytes):
            return
        y = int(self.model.add_vars(1, integer=True)[0])
        for expr in any_of:
            idx, val = expr.arrays()
            self.model.add_row(np.concatenate([[y], idx]), np.concatenate([[1.0], -val]), lo=expr.const)
        self.memory.add(self.and_vector(ind, y), nbytes.astype(float))

    def pair_cost(self, ind_u: np.ndarray, ind_v: np.ndarray, mat: np.ndarray, into: LinExpr,
                  allowed: np.ndarray | None = None) -> None:
        """Add sum_{p,q} mat[p, q]·ind_u[p]·ind_v[q] to `into`; both vectors have the same sum (1 or c).
        `allowed`: see `pair_vars`."""
        if not np.any(mat):
            return
        parts = _split(mat) if allowed is None else None
        if parts is not None:
            into.add(ind_u, parts[0])
            into.add(ind_v, parts[1])
            return
        into.add(self.pair_vars(ind_u, ind_v, allowed).ravel(), mat.ravel())

    def pair_top(self, ind_u: np.ndarray, ind_v: np.ndarray, work: np.ndarray | None,
                 allowed: np.ndarray | None = None) -> None:
        """T >= work[p, q] when u takes p and v takes q (a conversion's working set), for one-hot vectors.
        `allowed`: see `pair_vars` (both vectors must then have several entries)."""
        if work is None or not np.any(work):
            return
        if len(ind_u) == 1 and ind_u[0] == ONE:
            self.top(ind_v, work[0].astype(float))
            return
        if len(ind_v) == 1 and ind_v[0] == ONE:
            self.top(ind_u, work[:, 0].astype(float))
            return
        expr = LinExpr()
        expr.add(self.pair_vars(ind_u, ind_v, allowed).ravel(), work.ravel().astype(float))
        self.tops.append((expr, float(work.max())))

    def pair_vars(self, ind_u: np.ndarray, ind_v: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
        """e[p, q] = ind_u[p]·ind_v[q] for vectors with the same sum (one-hot, or and-vectors of one flag):
        continuous variables with both marginals, exact for integer indicators. One set per pair of vectors,
        shared by every term on it (an edge's time, working set and saved bytes): fewer variables, and a
        tighter relaxation, since separate copies could take different fractional values. `allowed`: a
        boolean matrix of the pairs that may be taken; the others get no variable (ZERO), so the marginals
        rule them out (reduced-cost fixing of pairs, `planner.search.solve.fixing`)."""
        key = (np.asarray(ind_u).tobytes(), np.asarray(ind_v).tobytes(), b"" if allowed is None else allowed.tobytes())
        if key in self._pairs:
            return self._pairs[key]
        n_u, n_v = len(ind_u), len(ind_v)
        mask = np.ones((n_u, n_v), dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
        e = np.full((n_u, n_v), ZERO, dtype=np.int64)
        e[mask] = self.model.add_vars(int(mask.sum()))
        self._pairs[key] = e
        for p in range(n_u):
            self._marginal(e[p, :], ind_u[p])
        for q in range(n_v):
            self._marginal(e[:, q], ind_v[q])
        return e

    def _marginal(self, pair_vars: np.ndarray, target: int) -> None:
        pair_vars = pair_vars[pair_vars != ZERO]
        ones = np.ones(len(pair_vars))
        if target == ONE:
            self.model.add_row(pair_vars, ones, 1.0, 1.0)
        else:
            self.model.add_row(np.concatenate([pair_vars, [target]]), np.concatenate([ones, [-1.0]]), 0.0, 0.0)

    def add_expr_row(self, expr: LinExpr, lo: float = -np.inf, hi: float = np.inf) -> None:
        """lo <= expr <= hi, moving the expression's constant to the bounds."""
        idx, val = expr.arrays()
        self.model.add_row(idx, val, lo - expr.const, hi - expr.const)

    def top(self, ind: np.ndarray, coef: np.ndarray) -> None:
        """T >= sum_p coef[p]·ind[p] for a one-hot `ind`."""
        if (len(ind) == 1 and ind[0] == ONE) or np.all(coef == coef[0]):
            self.top_floor = max(self.top_floor, float(coef[0]))
            return
        expr = LinExpr()
        expr.add(ind, coef)
        self.tops.append((expr, float(np.max(coef))))

    def finish(self, mode: str, budget: int | None) -> MilpModel:
        """Add T and its rows, the memory row when `budget` is given, and the objective: step time when
        mode == "time", peak memory (in units) when mode == "memory"."""
        m = self.model
        t_var = int(m.add_vars(1, lb=self.top_floor / self.unit, ub=np.inf)[0])
        for expr, upper in self.tops:
            if upper <= self.top_floor:
                continue  # never above the floor
            idx, val = expr.arrays()
            m.add_row(np.concatenate([[t_var], idx]), np.concatenate([[1.0], -val / self.unit]), lo=expr.const / self.unit)
        idx, val = self.memory.arrays()
        mem_idx = np.concatenate([idx, [t_var]])
        mem_val = np.concatenate([val / self.unit, [1.0]])
        if budget is not None:  # peaks are whole bytes: half a byte of slack accepts exactly peak <= budget
            m.add_row(mem_idx, mem_val, hi=(budget + 0.5 - self.memory.const) / self.unit)
        self.scale = self.time_scale if mode == "time" else 1.0 / self.unit
        if mode == "time":
            t_idx, t_val = self.time.arrays()
            m.add_cost(t_idx, t_val * self.time_scale)
            m.offset = self.time.const * self.time_scale
        elif mode == "memory":
            m.add_cost(mem_idx, mem_val)
            m.offset = self.memory.const / self.unit
        else:
            raise ValueError(f"mode must be 'time' or 'memory', not {mode!r}")
        return m


def build_flat(ip: IndexedProblem, mode: str, budget: int | None,
               allowed: dict[int, np.ndarray] | None = None, checkpointed: frozenset[int] | None = None,
               held: bool = False) -> BuiltModel:
    """The flat ILP of the module docstring for `ip`. `allowed`: per edge (its index in `ip.edges`, both ends
    with several choices), a boolean matrix of the pairs of choices an answer may take; the others are ruled
    out (`fixing.prove`: no faster answer takes them). `checkpointed`: the blocks checkpointed, fixed (no
    checkpoint binaries: every and-vector of a block in it is its node's one-hot, so the recompute peak rows
    bind without the relaxation's fractional flags); None: chosen by the ILP. `held`: the gradients held beside
    each op count in the max term too (`ip.held`, `Problem.held_beside`; time mode): the plan's accounting counts
    them, the formulas do not, and the rows make the ILP harder, so only where an answer without them was refused
    (`fixing.prove`; on the 60 tiny HF cells with them in every flat ILP: 2 plans slower, HF LLaMA 8 ranks 1.5x
    0.00 -> 4.77 % gap, the CPU 128 -> 173 s over the first 27 cells)."""
    allowed = allowed or {}
    held = held and mode == "time"
    b = IlpBuilder(ip)
    s = [b.one_hot(n) for n in ip.sizes]
    # a node of a block fixed checkpointed has its working set in its recompute row below, which holds more
    fixed = [ip.checkpointing and checkpointed is not None and ip.block_of[v] in checkpointed for v in range(ip.n)]
    for v in range(ip.n):
        b.time.add(s[v], ip.time[v])
        b.memory.add(s[v], ip.state[v] + ip.saved[v])
        # with the held rows, each working set as the plan counts it where the block is not checkpointed (less what
        # the op saves, beside a conversion into it); a checkpointed block's recompute rows below count it whole
        if not fixed[v]:
            b.top(s[v], (ip.transient_unckpt if held else ip.transient)[v].astype(float))
    for k, e in enumerate(ip.edges):
        mask = allowed.get(k)
        if mask is not None:  # the pair variables that rule the other pairs out, whatever the costs
            b.pair_vars(s[e.src], s[e.dst], mask)
        b.pair_cost(s[e.src], s[e.dst], e.cost, b.time, mask)
        if not fixed[e.dst]:
            b.pair_top(s[e.src], s[e.dst], e.unckpt() if held else e.transient, mask)
        if e.saved is not None:
            b.pair_cost(s[e.src], s[e.dst], e.saved.astype(float), b.memory, mask)
    flags: list[int] = []  # per block: its checkpoint binary, or ONE / ZERO where `checkpointed` fixes it
    lands: dict[int, Callable[[int], np.ndarray]] = {}  # per block that may be checkpointed: its and-vectors
    if ip.checkpointing:
        for blk, members in enumerate(ip.block_nodes):
            if checkpointed is None:
                c = int(b.model.add_vars(1, integer=True)[0])
            else:
                c = ONE if blk in checkpointed else ZERO
            flags.append(c)
            if c == ZERO:
                continue
            ands: dict[int, np.ndarray] = {}

            def land(v: int, c: int = c, ands: dict[int, np.ndarray] = ands) -> np.ndarray:
                if v not in ands:
                    ands[v] = s[v] if c == ONE else b.and_vector(s[v], c)
                return ands[v]

            for v in members:
                b.time.add(land(v), ip.recompute[v])
                b.memory.add(land(v), -ip.saved[v].astype(float))

            def recomputed(upto: int, members: list[int] = members, land=land) -> tuple[LinExpr, float]:
                """The activations the block recomputes up to and including node `upto` (in the block's
                order) when it is checkpointed, and their largest value."""
                expr, most = LinExpr(), 0.0
                for v in members[:members.index(upto) + 1]:
                    expr.add(land(v), ip.saved[v].astype(float))
                    most += float(ip.saved[v].max())
                return expr, most

            lands[blk] = land
            # the recompute peak: those activations beside each op's working set (problem.py); not where the held
            # rows count the block's forward re-run as the plan does (`Problem.held_rerun`: these can count more)
            peaks = not (held and blk in ip.held_rerun)
            for v in members if peaks else []:
                expr, most = recomputed(v)
                expr.add(land(v), ip.transient[v].astype(float))
                b.tops.append((expr, most + float(ip.transient[v].max())))
            for k, e in enumerate(ip.edges):
                if peaks and ip.block_of[e.dst] == blk and e.transient is not None:
                    expr, most = recomputed(e.dst)
                    pairs = b.pair_vars(land(e.src), land(e.dst), allowed.get(k))
                    expr.add(pairs.ravel(), e.transient.ravel().astype(float))
                    b.tops.append((expr, most + float(e.transient.max())))
            src = ip.block_input[blk]
            b.memory.add(np.array([c]) if src is None else land(src), ip.input_bytes[blk].astype(float))
            for k, e in enumerate(ip.edges):
                if ip.block_of[e.dst] == blk:
                    b.pair_cost(land(e.src), land(e.dst), e.recompute, b.time, allowed.get(k))
        for v, nbytes, blocks in ip.shared:
            if checkpointed is not None:
                if checkpointed & set(blocks):
                    b.memory.add(s[v], nbytes.astype(float))
                continue
            flag_exprs = []
            for blk in sorted(blocks):
                expr = LinExpr()
                expr.add(np.array([flags[blk]]), 1.0)
                flag_exprs.append(expr)
            b.kept_while(s[v], nbytes, flag_exprs)
    if held:
        _held_rows(b, ip, s, lands, allowed, flags)
    model = b.finish(mode, budget)
    if held and budget is not None and ip.held_step is not None:
        _step_row(b, ip, s, budget)

    def extract(x: np.ndarray) -> tuple[list[int], list[int]]:
        choice = [0 if len(ind) == 1 and ind[0] == ONE else int(np.argmax(x[ind])) for ind in s]
        return choice, [blk for blk, c in enumerate(flags) if c == ONE or (c >= 0 and x[c] > 0.5)]

    def encode(choice: list[int], ckpt: list[int]) -> dict[int, float]:
        values = {int(i): float(k == c) for ind, c in zip(s, choice) if ind[0] != ONE for k, i in enumerate(ind)}
        values.update({c: float(blk in ckpt) for blk, c in enumerate(flags) if c >= 0})
        return values

    return BuiltModel(model, b.unit, extract, b.scale, encode)


def _held_rows(b: IlpBuilder, ip: IndexedProblem, s: list[np.ndarray], lands: dict[int, Callable[[int], np.ndarray]],
               allowed: dict[int, np.ndarray], flags: list[int]) -> None:
    """Memory += each `ip.held_saved` copy (`Problem.held_saved`) on its pair variables, less the same on the
    and-vectors of a checkpointed block, and -= each `ip.held_less` (the same way; one with clauses on a variable per
    choice bounded by each, which the memory row pushes up to their product); T >= each `ip.held` row
    (`Problem.held_beside`): an op's working set on its node's one-hot (or its conversion's on the edge's pair
    variables), the gradients held beside it on their producers' one-hots (and pair variables); a row at a block's
    recomputation only where that block may be checkpointed, every term on the block's and-vectors (zero when it is
    not, as `evaluate.held_bytes` counts it)."""
    edges = {(e.src, e.dst): k for k, e in enumerate(ip.edges)}
    shared: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # a term's variables and coefficients, by its arrays

    def pair_term(pairs: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A pair term of a row as one variable equal to it, shared by every row with the same term (a gradient
        apart where a passthrough breaks is beside every op up to its block's recomputation: hf-gpt2's 41 rows of
        630 pair variables each, which cut the held ILP's work limit (per nonzero) short of its proof)."""
        key = (pairs.tobytes(), nbytes.tobytes())
        if key not in shared:
            z = int(b.model.add_vars(1, lb=-np.inf, ub=np.inf)[0])
            term = LinExpr()
            term.add(np.array([z]), 1.0)
            some = nbytes.ravel() != 0
            term.add(pairs.ravel()[some], -nbytes.ravel()[some].astype(float))
            b.add_expr_row(term, 0.0, 0.0)
            shared[key] = np.array([z]), np.ones(1)
        return shared[key]

    def apart_term(ind: np.ndarray, nbytes: np.ndarray, conditions: list[tuple[np.ndarray, np.ndarray]]
                   ) -> tuple[np.ndarray, np.ndarray]:
        """nbytes[k]·ind[k]·(any condition holds) (`problem.Apart`; each condition: variables, which where it holds)
        as w[k] >= ind[k] + broken - 1, w >= 0, shared by every row with the same term: a gradient apart from the
        op's output's only where a passthrough breaks, which the linear form (its bytes less its most, plus its most
        where it breaks) counts below zero where they share. With several conditions, broken is one variable at
        least each condition's (the least the ILP can take is 1 where one holds, 0 where none does)."""
        key = (b"apart", ind.tobytes(), nbytes.tobytes(), *(x for v, m in conditions for x in (v.tobytes(), m.tobytes())))
        if key not in shared:
            if len(conditions) == 1:
                broken, weights = conditions[0][0][conditions[0][1]], -np.ones(int(conditions[0][1].sum()))
            else:
                z = b.model.add_vars(1, ub=1.0)
                for v, m in conditions:
                    row = LinExpr()
                    row.add(z, 1.0)
                    row.add(v[m], -1.0)
                    b.add_expr_row(row, lo=0.0)
                broken, weights = z, -np.ones(1)
            some = np.flatnonzero(nbytes)
            w = b.model.add_vars(len(some))
            for k, wk in zip(some, w):
                row = LinExpr()
                row.add(np.array([wk, ind[k]]), np.array([1.0, -1.0]))
                row.add(broken, weights)
                b.add_expr_row(row, lo=-1.0)
            shared[key] = (w, nbytes[some].astype(float))
        return shared[key]

    for u, v, nbytes in ip.held_saved:  # saved all step, unless v's block is checkpointed (then recomputed)
        k = edges.get((u, v))
        mask = None if k is None else allowed.get(k)
        b.memory.add(b.pair_vars(s[u], s[v], mask).ravel(), nbytes.ravel().astype(float))
        blk = ip.block_of[v]
        if blk in lands:
            b.memory.add(b.pair_vars(lands[blk](u), lands[blk](v), mask).ravel(), -nbytes.ravel().astype(float))
    for v, nbytes, where in ip.held_less:  # saved bytes the formulas may count twice, unless v's block is checkpointed
        blk = ip.block_of[v]
        if 0 <= blk < len(flags) and flags[blk] == ONE:
            continue
        if not where:
            b.memory.add(s[v], -nbytes.astype(float))
            if blk in lands:
                b.memory.add(lands[blk](v), nbytes.astype(float))
            continue
        # only where its clauses hold: t[k] <= s[v][k], t[k] <= each clause's sum (and <= 1 - the block's flag), which
        # the memory row pushes up to their least: 1 exactly where all hold (bytes >= 0)
        flag = flags[blk] if blk in lands else None
        some = np.flatnonzero(nbytes)
        t = b.model.add_vars(len(some))
        clauses = [np.concatenate([s[u][marks] for u, marks in clause]) for clause in where]
        for k, tk in zip(some, t):
            for ind in [s[v][k:k + 1], *clauses]:
                row = LinExpr()
                row.add(np.array([tk]), 1.0)
                row.add(ind, -1.0)
                b.add_expr_row(row, hi=0.0)
            if flag is not None:
                b.model.add_row(np.array([tk, flag]), np.ones(2), -np.inf, 1.0)
        b.memory.add(t, -nbytes[some].astype(float))
    for row in ip.held:
        v, blk = row.node, ip.block_of[row.node]
        if row.recomputation and blk not in lands:
            continue
        ends = lands[blk] if row.recomputation else (lambda w: s[w])
        expr, most = LinExpr(), 0.0
        for u, nbytes in row.recomputed:
            expr.add(ends(u), nbytes.astype(float))
            most += float(nbytes.max())
        for u, w, nbytes in row.recomputed_pairs:
            k = edges.get((u, w))
            expr.add(*pair_term(b.pair_vars(ends(u), ends(w), None if k is None else allowed.get(k)), nbytes))
            most += float(nbytes.max())
        # the floor on the node's one-hot (an and-vector at a recomputation: nothing where its block is not checkpointed)
        expr.add(ends(v), row.own.astype(float) + row.floor)
        most += float(row.own.max()) + row.floor
        if row.source is not None:
            k = edges.get((row.source, v))
            work = None if k is None else ip.edges[k].transient
            if work is None:
                continue
            expr.add(b.pair_vars(ends(row.source), ends(v), allowed.get(k)).ravel(), work.ravel().astype(float))
            most += float(work.max())
        for u, nbytes in row.terms:
            expr.add(ends(u), nbytes.astype(float))
            most += float(nbytes.max())
        for u, w, nbytes in row.pairs:
            k = edges.get((u, w))
            expr.add(*pair_term(b.pair_vars(ends(u), ends(w), None if k is None else allowed.get(k)), nbytes))
            most += float(nbytes.max())
        for u, nbytes, conditions in row.apart:  # (on and-vectors: ind + broken - 1 <= 0 where not checkpointed)
            conds = []
            for x, y, breaks in conditions:
                k = edges.get((x, y))
                conds.append((ends(x) if y is None else b.pair_vars(ends(x), ends(y), None if k is None
                                                                     else allowed.get(k)), breaks))
            expr.add(*apart_term(ends(u), nbytes, conds))
            most += float(nbytes.max())
        b.tops.append((expr, most))


def _step_row(b: IlpBuilder, ip: IndexedProblem, s: list[np.ndarray], budget: int) -> None:
    """The optimizer step's row (`Problem.held_step`): states + what the step holds beside them <= budget, all the
    nodes' bytes at once (foreach) or the largest (single-tensor: a variable at least each node's)."""
    summed, per, fixed = ip.held_step
    expr = LinExpr()
    for v in range(ip.n):
        expr.add(s[v], (ip.state[v] + (per[v] if summed else 0)).astype(float))
    if not summed:
        most = int(b.model.add_vars(1, ub=np.inf)[0])
        for v in range(ip.n):
            row = LinExpr()
            row.add(np.array([most]), 1.0)
            row.add(s[v], -per[v].astype(float))
            b.add_expr_row(row, lo=0.0)
        expr.add(np.array([most]), 1.0)
    idx, val = expr.arrays()
    b.model.add_row(idx, val / b.unit, hi=(budget + 0.5 - fixed - expr.const) / b.unit)


def flat_size(ip: IndexedProblem) -> int:
    """The number of integer (node and checkpoint) variables the flat ILP would have."""
    nodes = sum(n for n in ip.sizes if n > 1)
    return nodes + (len(ip.block_nodes) if ip.checkpointing else 0)


def flat_pairs(ip: IndexedProblem) -> int:
    """A cheap measure of the flat ILP's size before building it: its one-hot variables plus the pair
    variables its edges could need (it has about 3x as many variables: checkpointed copies and rows)."""
    return sum(ip.sizes) + sum(ip.sizes[e.src] * ip.sizes[e.dst] for e in ip.edges)
