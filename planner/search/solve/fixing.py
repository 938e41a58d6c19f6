"""Reduced-cost fixing: the options that can still be in a faster answer, and the exact flat ILP over them.

The priced search's lower bound is Lagrangian: for a range [floor, cap] of max-term levels and its price
(1, b, c, cap) (`priced_bound.banded_bound`'s ranges, or the best price over all levels), every fitting
assignment x whose max term lies in the range has time(x) >= price_bound(S(x)), S its priced sum
a·time + b·additive bytes + c·recomputed bytes. S(x) is at least the least priced sum over the assignments
that give node v the option x_v: v's min-marginal (per set of checkpointed blocks: a block's flag changes
every one of its nodes' costs; every node's and edge's from one elimination over the whole problem and its
pass back, `eliminate.min_marginals`). So an option
whose bound is at least the answer's time in every range is in no faster answer (reduced-cost fixing), and
the flat ILP over the options left (`restrict`), started from the answer, either finds a faster one or proves
that none exists. The same holds for a pair of options on an edge, from the min-marginal of its two nodes
(`pair_bounds`): the ILP gets no variable for a pair that is cut, which rules it out. On HF LLaMA (2 layers,
2x2x2, 1.25x its smallest budget) 500 of 1,018 options are left, and 2,110 of the 4,000 pairs between them;
the flat ILP over them proves the optimum in 3.5 s (54 s over every option, 14 s over the options left). The
same Lagrangian bound over the options left barely rises (0.5012 -> 0.5013 ms against the optimum 0.5383):
the gap is the relaxation's, not the options', which is why the ILP does the proving.

Sets of checkpointed blocks are enumerated, so this runs on problems of at most _MAX_BLOCKS blocks.
"""

from __future__ import annotations

import copy
import functools
import itertools
import time

import numpy as np

from planner.search.solve.block_dp import Price
from planner.search.solve.driver import solve_built
from planner.search.solve.eliminate import min_marginals
from planner.search.solve.evaluate import evaluate_indexed
from planner.search.solve.flat_start import priced_costs
from planner.search.solve.frontier import topological_order
from planner.search.solve.ilp import build_flat
from planner.search.solve.indexed import IndexedEdge, IndexedProblem
from planner.search.solve.milp import LEAN_OPTIONS, NO_PROBING
from planner.search.solve.problem import GAP_TOLERANCE, Solution, relative_gap

__all__ = ["option_bounds", "pair_bounds", "prove", "restrict"]

_MAX_BLOCKS = 4  # 2^M sets of checkpointed blocks per range
# HiGHS options for the proving ILP: no restarts, no RINS/RENS sub-MIPs, no probing (the column ILPs' options,
# `milp`). It starts from the answer and mostly has to raise its bound: on four saved ILPs of the tiny HF models
# (2x2x2, 1.25-2x their smallest budgets) 52 s -> 29 s wall in all, the same optima.
PROVE_OPTIONS = {**LEAN_OPTIONS, **NO_PROBING}


def _bounds(ip: IndexedProblem, ranges: list[tuple[float, Price]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per node, and per edge of `ip.edges`, the bounds of `option_bounds` and `pair_bounds`: the min-marginals of
    the priced sum under every (range, set of checkpointed blocks), all from one elimination and its pass back
    (`eliminate.min_marginals`), each turned into the time bound its price proves; the least over them."""
    m = len(ip.block_nodes)
    sets = [frozenset(c) for k in range(m + 1) for c in itertools.combinations(range(m), k)] \
        if ip.checkpointing else [frozenset()]
    combos = [(floor, price, ckpt) for floor, price in ranges for ckpt in sets]
    unary, incoming = priced_costs(ip, combos)
    order = topological_order(ip.n, [(e.src, e.dst) for e in ip.edges]) or list(range(ip.n))
    nodes, pairs = min_marginals(order, dict(enumerate(ip.sizes)), unary, incoming, batch=len(combos))
    # what price_bound adds to a priced minimum, per combination: (b - c·M)·floor - b·budget
    shift = np.array([(p.b - p.c * m) * floor - p.b * ip.budget for floor, p, _ in combos])
    return ([(nodes[v] + shift[:, None]).min(axis=0) for v in range(ip.n)],
            [(pairs[e.src, e.dst] + shift[:, None, None]).min(axis=0) for e in ip.edges])


def option_bounds(ip: IndexedProblem, ranges: list[tuple[float, Price]]) -> list[np.ndarray]:
    """Per node, per option: a lower bound on the time of every fitting assignment that gives the node that
    option (the least over `ranges`, each (floor level, price with the range's cap), of the bound its price
    proves from the option's min-marginal; see the module docstring). The ranges must cover every max-term
    level a fitting assignment can have. Shared inputs (`ip.shared`) are left out of the priced sum, which only
    lowers it: the bounds stay valid."""
    return _bounds(ip, ranges)[0]


def pair_bounds(ip: IndexedProblem, ranges: list[tuple[float, Price]]) -> list[np.ndarray]:
    """Per edge of `ip.edges`, per pair of its nodes' options: a lower bound on the time of every fitting
    assignment that takes that pair, as `option_bounds` per option (the min-marginal of the two nodes
    together). A pair can be out of every faster answer where neither of its options is: on HF LLaMA (2x2x2,
    1.25x) 1,890 of the 4,000 pairs left by option fixing."""
    return _bounds(ip, ranges)[1]


def restrict(ip: IndexedProblem, keep: list[np.ndarray]) -> IndexedProblem:
    """`ip` with node v's options cut to `keep[v]` (indices, in order): option i of the result is option
    keep[v][i] of `ip`. Names, blocks, budget and the problem it views are the same."""
    out = copy.copy(ip)
    out.sizes = [len(k) for k in keep]
    for name in ("time", "recompute", "state", "saved", "transient"):
        setattr(out, name, [values[k] for values, k in zip(getattr(ip, name), keep)])
    out.labels = [None if labels is None else labels[k] for labels, k in zip(ip.labels, keep)]

    def cut(mat: np.ndarray | None, e: IndexedEdge) -> np.ndarray | None:
        return None if mat is None else mat[np.ix_(keep[e.src], keep[e.dst])]

    out.edges = [IndexedEdge(e.src, e.dst, cut(e.cost, e), cut(e.recompute, e), cut(e.transient, e), cut(e.saved, e))
                 for e in ip.edges]
    out.input_bytes = [nbytes if src is None else nbytes[keep[src]] for nbytes, src in zip(ip.input_bytes, ip.block_input)]
    out.shared = [(v, nbytes[keep[v]], blocks) for v, nbytes, blocks in ip.shared]
    return out


def applies(ip: IndexedProblem) -> bool:
    """Whether `prove` runs on `ip`: at most _MAX_BLOCKS blocks (it enumerates their checkpointed sets)."""
    return len(ip.block_nodes) <= _MAX_BLOCKS


def prove(ip: IndexedProblem, sol: Solution, ranges: list[tuple[float, Price]], solver: str,
          deadline: float, work_limit: int | None = None) -> Solution | None:
    """`sol` proven optimal, or a faster answer, from the flat ILP over the options and pairs of options that
    can beat it (`option_bounds`, `pair_bounds`), with the answer's own kept and the answer as its start
    (`work_limit`: its work, None for none); None where there are more than _MAX_BLOCKS blocks. The figures
    are `ip`'s; the bound is the ILP's over what is left, or the answer's time where that is lower (everything
    cut is at least that slow)."""
    if not applies(ip) or not sol.choice:
        return None
    start = time.perf_counter()
    target = sol.objective
    choice, ckpt = ip.vectors(sol.choice, sol.checkpointed)
    bounds, pairs = _bounds(ip, ranges)
    keep = [np.flatnonzero((bnd < target) | (np.arange(len(bnd)) == c)) for bnd, c in zip(bounds, choice)]
    left = restrict(ip, keep)
    position = [{int(j): i for i, j in enumerate(k)} for k in keep]
    initial = [position[v][c] for v, c in enumerate(choice)]
    allowed = {}  # per edge whose nodes keep several options: the pairs that can beat the answer, and its own
    for k, (e, bnd) in enumerate(zip(ip.edges, pairs)):
        if len(keep[e.src]) > 1 and len(keep[e.dst]) > 1:
            allowed[k] = bnd[np.ix_(keep[e.src], keep[e.dst])] < target
            allowed[k][initial[e.src], initial[e.dst]] = True
    flat = solve_built(left, functools.partial(build_flat, left, allowed=allowed), solver=solver, deadline=deadline,
                       method="flat", initial=(initial, ckpt), work_limit=work_limit, options=PROVE_OPTIONS)
    if flat.status not in ("optimal", "feasible") or not flat.choice:
        return None
    picked = [int(keep[v][flat.choice[n]]) for v, n in enumerate(ip.names)]
    blocks = [ip.block_index(b) for b in flat.checkpointed]
    time_s, peak, _ = evaluate_indexed(ip, picked, blocks)
    fits = peak <= ip.budget
    # the ILP's answer replaces the old one only where it is faster by more than the gap that counts as
    # optimal: an equally fast one may leave the plan's accounting less room (`plans.meshes.use_room`)
    faster = fits and time_s < target * (1 - GAP_TOLERANCE)
    # proven: the ILP's optimum over what is left is its answer, and everything cut takes at least the old
    # answer's time; so the optimum is the lesser of the two
    proven = flat.status == "optimal" and fits
    bound = min(time_s, target) if proven else min(flat.bound, target) if np.isfinite(flat.bound) else sol.bound
    if not faster:
        picked, blocks, time_s, peak = choice, ckpt, target, sol.peak_bytes
    note = (f"{'proven optimal' if proven else 'not proven'} by the flat ILP over the {sum(map(len, keep))} of "
            f"{sum(ip.sizes)} options that can beat {target * 1e3:.4f} ms (reduced-cost fixing)")
    out = Solution(
        status="feasible", choice=dict(zip(ip.names, picked)), checkpointed=[ip.block_names[b] for b in blocks],
        objective=time_s, gap=relative_gap(time_s, sol.bound), seconds=sol.seconds + time.perf_counter() - start,
        solver=flat.solver, peak_bytes=peak, method=sol.method, bound=sol.bound,
        message=note if proven else "; ".join(m for m in (sol.message, note) if m))  # proven: no limit mattered
    out.raise_bound(bound, GAP_TOLERANCE)
    return out
