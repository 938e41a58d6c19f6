"""Reduced-cost fixing: the options that can still be in a faster answer, and the exact flat ILP over them.

The priced search's lower bound is Lagrangian: for a range [floor, cap] of max-term levels and its price
(1, b, c, cap) (`priced_bound.banded_bound`'s ranges, or the best price over all levels), every fitting
assignment x whose max term lies in the range has time(x) >= price_bound(S(x)), S its priced sum
a·time + b·additive bytes + c·recomputed bytes. S(x) is at least the least priced sum over the assignments
that give node v the option x_v and checkpoint the set C: v's min-marginal under C (a block's flag changes
every one of its nodes' costs; every node's and edge's, under every set, from one elimination over the whole
problem and its pass back, `eliminate.min_marginals`). So an option whose bound under C is at least the
answer's time in every range is in no faster answer that checkpoints C (reduced-cost fixing), and the flat ILP
over the options left with C fixed (`restrict`, `build_flat(checkpointed=C)`) either finds a faster one or
proves that none exists; a set where some node keeps no option holds no faster answer at all. The same holds
for a pair of options on an edge, from the min-marginal of its two nodes (`pair_bounds`): the ILP gets no
variable for a pair that is cut, which rules it out. On HF LLaMA (2 layers, 2x2x2, 1.25x its smallest budget)
500 of 1,018 options are left, and 2,110 of the 4,000 pairs between them. The same Lagrangian bound over the
options left barely rises (0.5012 -> 0.5013 ms against the optimum 0.5383): the gap is the relaxation's, not
the options', which is why the ILP does the proving; and one ILP per set proves faster than one with a
checkpoint binary per block (`prove`).

Sets of checkpointed blocks are enumerated, so this runs on problems of at most MAX_BLOCKS blocks.
"""

from __future__ import annotations

import copy
import itertools
import math
import time

import numpy as np

from planner.search.solve.block_dp import Price
from planner.search.solve.eliminate import min_marginals
from planner.search.solve.evaluate import evaluate_indexed, held_peak
from planner.search.solve.flat_start import priced_costs
from planner.search.solve.frontier import topological_order
from planner.search.solve.ilp import build_flat
from planner.search.solve.indexed import IndexedEdge, IndexedProblem
from planner.search.solve.milp import LEAN_OPTIONS, NO_PROBING, resolve_solver, solve_milp
from planner.search.solve.problem import GAP_TOLERANCE, Solution, relative_gap

__all__ = ["kept_share", "option_bounds", "pair_bounds", "prove", "restrict", "MAX_BLOCKS"]

MAX_BLOCKS = 4  # 2^M sets of checkpointed blocks per range
# HiGHS options for the proving ILP: no restarts, no RINS/RENS sub-MIPs, no probing (the column ILPs' options,
# `milp`). It starts from the answer and mostly has to raise its bound: on four saved ILPs of the tiny HF models
# (2x2x2, 1.25-2x their smallest budgets) 52 s -> 29 s wall in all, the same optima.
PROVE_OPTIONS = {**LEAN_OPTIONS, **NO_PROBING}


def checkpoint_sets(ip: IndexedProblem) -> list[frozenset[int]]:
    """Every set of blocks an answer may checkpoint (only the empty one where checkpointing is off)."""
    m = len(ip.block_nodes)
    return [frozenset(c) for k in range(m + 1) for c in itertools.combinations(range(m), k)] \
        if ip.checkpointing else [frozenset()]


SetBounds = dict[frozenset[int], tuple[list[np.ndarray], list[np.ndarray]]]


def set_bounds(ip: IndexedProblem, ranges: list[tuple[float, Price]]) -> SetBounds:
    """Per set of checkpointed blocks: per node, and per edge of `ip.edges`, a lower bound on the time of every
    fitting assignment that checkpoints exactly that set and takes that option (pair of options): the
    min-marginals of the priced sum under every range, all from one elimination and its pass back
    (`eliminate.min_marginals`), each turned into the time bound its price proves; the least over the ranges."""
    m = len(ip.block_nodes)
    sets = checkpoint_sets(ip)
    combos = [(floor, price, ckpt) for floor, price in ranges for ckpt in sets]
    unary, incoming = priced_costs(ip, combos)
    order = topological_order(ip.n, [(e.src, e.dst) for e in ip.edges]) or list(range(ip.n))
    nodes, pairs = min_marginals(order, dict(enumerate(ip.sizes)), unary, incoming, batch=len(combos))
    # what price_bound adds to a priced minimum, per combination: (b - c·M)·floor - b·budget
    shift = np.array([(p.b - p.c * m) * floor - p.b * ip.budget for floor, p, _ in combos])
    out: SetBounds = {}
    for ckpt in sets:
        rows = np.array([i for i, (_, _, c) in enumerate(combos) if c == ckpt], dtype=np.int64)
        out[ckpt] = ([(nodes[v][rows] + shift[rows, None]).min(axis=0) for v in range(ip.n)],
                     [(pairs[e.src, e.dst][rows] + shift[rows, None, None]).min(axis=0) for e in ip.edges])
    return out


def option_bounds(ip: IndexedProblem, ranges: list[tuple[float, Price]]) -> list[np.ndarray]:
    """Per node, per option: a lower bound on the time of every fitting assignment that gives the node that
    option (the least over `ranges`, each (floor level, price with the range's cap), and over the sets of
    checkpointed blocks, of the bound its price proves from the option's min-marginal; see the module
    docstring). The ranges must cover every max-term level a fitting assignment can have. Shared inputs
    (`ip.shared`) are left out of the priced sum, which only lowers it: the bounds stay valid."""
    per_set = list(set_bounds(ip, ranges).values())
    return [np.min([nodes[v] for nodes, _ in per_set], axis=0) for v in range(ip.n)]


def pair_bounds(ip: IndexedProblem, ranges: list[tuple[float, Price]]) -> list[np.ndarray]:
    """Per edge of `ip.edges`, per pair of its nodes' options: a lower bound on the time of every fitting
    assignment that takes that pair, as `option_bounds` per option (the min-marginal of the two nodes
    together). A pair can be out of every faster answer where neither of its options is: on HF LLaMA (2x2x2,
    1.25x) 1,890 of the 4,000 pairs left by option fixing."""
    per_set = list(set_bounds(ip, ranges).values())
    return [np.min([pairs[k] for _, pairs in per_set], axis=0) for k in range(len(ip.edges))]


def restrict(ip: IndexedProblem, keep: list[np.ndarray]) -> IndexedProblem:
    """`ip` with node v's options cut to `keep[v]` (indices, in order): option i of the result is option
    keep[v][i] of `ip`. Names, blocks, budget and the problem it views are the same."""
    out = copy.copy(ip)
    out.sizes = [len(k) for k in keep]
    for name in ("time", "recompute", "state", "saved", "transient", "transient_unckpt"):
        setattr(out, name, [values[k] for values, k in zip(getattr(ip, name), keep)])
    out.labels = [None if labels is None else labels[k] for labels, k in zip(ip.labels, keep)]

    def cut(mat: np.ndarray | None, e: IndexedEdge) -> np.ndarray | None:
        return None if mat is None else mat[np.ix_(keep[e.src], keep[e.dst])]

    out.edges = [IndexedEdge(e.src, e.dst, cut(e.cost, e), cut(e.recompute, e), cut(e.transient, e), cut(e.saved, e),
                             cut(e.transient_unckpt, e)) for e in ip.edges]
    out.input_bytes = [nbytes if src is None else nbytes[keep[src]] for nbytes, src in zip(ip.input_bytes, ip.block_input)]
    out.shared = [(v, nbytes[keep[v]], blocks) for v, nbytes, blocks in ip.shared]
    memo: dict[int, tuple[object, object]] = {}
    out.held = [row.restricted(keep, memo) for row in ip.held]
    out.held_saved = [(u, v, b[np.ix_(keep[u], keep[v])]) for u, v, b in ip.held_saved]
    out.held_less = [(v, b[keep[v]], [[(u, m[keep[u]]) for u, m in clause] for clause in where])
                     for v, b, where in ip.held_less]
    if ip.held_step is not None:
        summed, per, fixed = ip.held_step
        out.held_step = (summed, [b[k] for b, k in zip(per, keep)], fixed)
    return out


def applies(ip: IndexedProblem) -> bool:
    """Whether `prove` runs on `ip`: at most MAX_BLOCKS blocks (it enumerates their checkpointed sets)."""
    return len(ip.block_nodes) <= MAX_BLOCKS


def kept_share(per_set: SetBounds, choice: list[int], own: frozenset[int], target: float) -> float:
    """The share of the options that can beat `target` (the answer's own kept in its set), over the sets whose every
    node keeps one (`prove` solves one ILP for each): HF LLaMA, 64 ranks, 4x4x4, at its smallest budget, over every
    level (no range of the bound search can beat the answer) keeps 1,361 of 1,396."""
    kept = total = 0
    for sets, (nodes, _) in per_set.items():
        keep = _kept(nodes, choice, sets == own, target)
        if all(len(k) for k in keep):
            kept, total = kept + sum(map(len, keep)), total + sum(len(bnd) for bnd in nodes)
    return kept / total if total else 0.0


def _kept(nodes: list[np.ndarray], choice: list[int], mine: bool, target: float) -> list[np.ndarray]:
    """Per node, the options whose bound (`nodes`, one set's) lies below `target`, and the answer's own (`choice`)
    where the set is its own (`mine`)."""
    return [np.flatnonzero((bnd < target) | ((np.arange(len(bnd)) == c) & mine)) for bnd, c in zip(nodes, choice)]


def prove(ip: IndexedProblem, sol: Solution, ranges: list[tuple[float, Price]], solver: str,
          deadline: float, work_limit: int | None = None, held: bool = False,
          max_share: float | None = None) -> Solution | None:
    """`sol` proven optimal, or a faster answer, from one flat ILP per set of checkpointed blocks, each over the
    options and pairs of options that can beat the fastest answer so far with that set (`set_bounds`) and with
    the set fixed (`build_flat(checkpointed=)`): the answer's own set first, started from the answer, then the
    others from the least bound up, each with the fastest answer so far as its cutoff; a set where some node
    keeps no option is skipped (nothing in it is faster). Once an ILP stops at its limit the rest are not solved
    (no proof can come of them, and the piece swaps look for faster answers next): they count with the bound
    their prices prove (HF LLaMA with 4 layers, 8 ranks, 2x: the 14 other sets took 7 s CPU and found
    nothing). `work_limit`: each ILP's work (None for none); None
    where there are more than MAX_BLOCKS blocks. The figures are `ip`'s; the bound is the least over the sets
    of what each proves (its ILP's optimum or bound, or the answer's time where it could beat nothing).

    Fixing the set is what makes the proof fast: with a checkpoint binary per block, every recompute-peak row
    and every dropped activation sits on an and-vector of a node's options and that binary, whose relaxation
    lets a fractional flag drop half a block's activations and pay half its recompute peak. Fixed, those rows
    are on the one-hot vectors themselves. HF LLaMA (2 layers, 2x2x2, 1.5x its smallest budget; 815 of 1,018
    options left): 2.8 s CPU to prove the optimum against 20 s with the binaries (and not proven at half the
    usual work); HF BERT at 2x: 1.9 s against 4.5 s; the three other sets of each are skipped.

    `held`: the ILPs also count the gradients held beside each op (`build_flat(held=True)`): closer to what the
    plan's accounting counts, so used once an answer without them was refused (`refine._fixed`). `max_share`: None
    (no ILP solved) where the options kept, over the sets that keep some in every node, are more than this share
    of theirs (a proof over that many seldom closes within a work limit)."""
    if not applies(ip) or not sol.choice:
        return None
    start = time.perf_counter()
    choice, ckpt = ip.vectors(sol.choice, sol.checkpointed)
    own = frozenset(ckpt)
    per_set = set_bounds(ip, ranges)
    # per set, what its prices prove for every assignment that checkpoints it: each node's least option bound
    # holds for all of them, so the greatest over the nodes
    least = {c: max(float(b.min()) for b in nodes) for c, (nodes, _) in per_set.items()}
    order = sorted(per_set, key=lambda c: (c != own, least[c], sorted(c)))
    if max_share is not None and kept_share(per_set, choice, own, sol.objective) > max_share:
        return None
    best = (choice, ckpt, sol.objective, sol.peak_bytes)  # the fastest fitting answer so far
    proves = []  # per set solved: the least time it can hold (-inf where unknown)
    kept = solved = 0
    limit = ""
    for i, sets in enumerate(order):
        target = best[2]
        nodes, pairs = per_set[sets]
        mine = sets == own
        keep = _kept(nodes, choice, mine, target)
        if any(len(k) == 0 for k in keep):
            continue  # every assignment checkpointing this set takes at least `target`
        found, holds, note = _solve_set(ip, sets, keep, pairs, choice if mine else None, target, solver, deadline,
                                        work_limit, held)
        kept, solved = kept + sum(map(len, keep)), solved + 1
        proves.append(min(holds, target))
        if found is not None and found[2] < best[2] * (1 - GAP_TOLERANCE):
            best = found
        if note:  # stopped by its limit: nothing is proven whatever the other sets hold; they keep the bound
            limit = note  # their prices prove (`least`)
            proves += [least[c] for c in order[i + 1:]]
            break
    picked, blocks, time_s, peak = best
    proven = all(p >= time_s * (1 - GAP_TOLERANCE) for p in proves)
    bound = min([time_s, *proves])
    if not math.isfinite(bound):
        bound = sol.bound
    note = (f"{'proven optimal' if proven else 'not proven'} by the flat ILP over the options that can beat "
            f"{sol.objective * 1e3:.4f} ms (reduced-cost fixing; one ILP per set of checkpointed blocks that can: "
            f"{solved} of {len(per_set)} sets, {kept} of {solved * sum(ip.sizes)} options)")
    out = Solution(
        status="feasible", choice=dict(zip(ip.names, picked)), checkpointed=[ip.block_names[b] for b in blocks],
        objective=time_s, gap=relative_gap(time_s, sol.bound), seconds=sol.seconds + time.perf_counter() - start,
        solver=resolve_solver(solver), peak_bytes=peak, method=sol.method, bound=sol.bound,
        message=note if proven else "; ".join(m for m in (sol.message, note, limit) if m))  # proven: no limit mattered
    out.raise_bound(bound, GAP_TOLERANCE)
    return out


def _solve_set(ip: IndexedProblem, sets: frozenset[int], keep: list[np.ndarray], pairs: list[np.ndarray],
               start: list[int] | None, target: float, solver: str, deadline: float, work_limit: int | None,
               held: bool = False) -> tuple[tuple[list[int], list[int], float, int] | None, float, str]:
    """The flat ILP over the options `keep` and the pairs of them that can beat `target`, with the blocks `sets`
    checkpointed: (its answer as (choice, blocks, time, peak) where one fits, else None; the least time the
    assignments checkpointing `sets` can hold, -inf where unknown; what stopped it, "" if nothing).
    `start`: the answer's choice, kept and handed to the ILP as its start (its set is `sets`); without one,
    the ILP's cutoff is `target` (it prunes every branch that cannot beat it)."""
    left = restrict(ip, keep)
    position = [{int(j): i for i, j in enumerate(k)} for k in keep]
    initial = None if start is None else [position[v][c] for v, c in enumerate(start)]
    allowed = {}  # per edge whose nodes keep several options: the pairs that can beat the target, and the start's
    for k, (e, bnd) in enumerate(zip(ip.edges, pairs)):
        if len(keep[e.src]) > 1 and len(keep[e.dst]) > 1:
            allowed[k] = bnd[np.ix_(keep[e.src], keep[e.dst])] < target
            if initial is not None:
                allowed[k][initial[e.src], initial[e.dst]] = True
    built = build_flat(left, "time", left.budget, allowed=allowed, checkpointed=sets, held=held)
    mip_start = None if initial is None or built.encode is None else built.encode(initial, sorted(sets))
    res = solve_milp(built.model, solver=solver, time_limit=deadline - time.perf_counter(), work_limit=work_limit,
                     mip_start=mip_start, options=PROVE_OPTIONS, cutoff=np.inf if start is not None else target * built.scale)
    found = None
    if res.x is not None:
        local, blocks = built.extract(res.x)
        picked = [int(keep[v][c]) for v, c in enumerate(local)]
        time_s, peak, _ = evaluate_indexed(ip, picked, blocks)
        if held:  # the peak the ILP counts: the formulas' may be over the budget where the held rows take off what
            peak = held_peak(ip, picked, blocks)  # they count twice (HF LLaMA, 64 ranks, 1.25x: 4,096 B)
        if peak <= ip.budget:
            found = (picked, blocks, time_s, peak)
    if res.status == "optimal":  # its answer is the least in the set (`found`; one over the budget by the solver's
        holds = found[2] if found is not None else -math.inf  # tolerance proves nothing)
    elif res.status == "infeasible":
        holds = target  # nothing kept fits (or beats the cutoff): the set's assignments all take at least `target`
    else:
        holds = res.bound / built.scale if np.isfinite(res.bound) else -math.inf
    return found, holds, "" if res.status in ("optimal", "infeasible") else res.message
