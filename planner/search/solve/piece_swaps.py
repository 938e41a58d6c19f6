"""Blocks no single price made cheapest: an answer's blocks with one piece swapped, and the column ILP over them.

The priced search's columns are whole blocks, each the cheapest under one price (`PricedRuns`). A block is
swept in pieces that meet only at one node's choice (a transformer layer: attention, then MLP, cut at the
residual stream), so a piece of one priced block can replace the piece of another that starts and ends on the
same choices: the result is a valid block, measured exactly. `improve` adds, around the answer, every block
one piece away from one of its blocks, and solves the column ILP again (from its better answer again):
HF LLaMA on 2x2x2 at 1.5x its smallest budget 0.4080 -> 0.4014 ms, the exact flat ILP's optimum, at 1.25x
0.5578 -> 0.5416 ms (optimum 0.5383), where the optimum puts one layer's attention on one scheme and the
other's on another.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from planner.search.solve import pinned
from planner.search.solve.block_dp import PORT
from planner.search.solve.frontier import FrontierPoint, undominated
from planner.search.solve.priced_runs import PricedRuns, first_rows
from planner.search.solve.problem import GAP_TOLERANCE, Solution
from planner.search.solve.two_level import TwoLevel, usable_columns

__all__ = ["improve", "piece_options", "swap_columns"]

# Column ILPs with the blocks one piece away from the answer's (`improve`), each from the last one's answer,
# with less work than the others: their faster answers came within 100 nodes (tiny HF models, 8 and 64
# ranks), and where there is none the root alone can take seconds (HF BERT on 64 ranks, 8x8, at its
# smallest budget: 2 s per round at 300 nodes, 0.4 s at this work limit, the same answers)
_SWAP_ROUNDS = 2
_SWAP_NODES = 300
_SWAP_STALL = 100
_SWAP_WORK = 1_000_000
_PIN_ROUNDS = 1  # ... and with the pinned minimisers' columns (a second round found nothing more on the tiny HF models)


def improve(runs: PricedRuns, sol: Solution, solver: str, deadline: float, rel_gap: Callable[[float], float],
            late: Callable[[], bool], pins: bool = False) -> tuple[list[int], list[int], float, bool] | None:
    """A faster assignment than `sol` (an answer of the search that made `runs`) that fits the budget, from
    the column ILP over every priced block and those one piece away from the answer's (`swap_columns`),
    again from each faster answer, _SWAP_ROUNDS rounds at most; then, with `pins`, the same rounds again once
    `pinned.pin_columns` recorded pinned minimisers that may beat that answer, without the columns no faster
    answer can use (`pinned.within_reach`). The second pass starts from the first's answer, so
    the pins never cost a plan the swaps found (with every column in one pass, a work-limited ILP of HF
    BERT on 4x4x4 stopped before the answer the swaps alone reach). Returns (choices, checkpointed blocks,
    time, whether an ILP stopped at a limit), or None. `rel_gap(upper)`: the gap at which an ILP may stop;
    `late()`: stop."""
    ip = runs.ip
    best = (*ip.vectors(sol.choice, sol.checkpointed), sol.objective)
    options = piece_options(runs)
    best, found, cut = _rounds(runs, runs._outer(None), options, best, solver, deadline, rel_gap, late, False)
    if pins and not late() and pinned.pin_columns(runs, best[2] * (1 - GAP_TOLERANCE), late):
        best, more, cut_more = _rounds(runs, runs._outer(None), options, best, solver, deadline, rel_gap, late, True,
                                       _PIN_ROUNDS)
        found, cut = found or more, cut or cut_more
    return (*best, cut) if found else None


def _rounds(runs: PricedRuns, outer: TwoLevel, options: list[Options], best: tuple[list[int], list[int], float],
            solver: str, deadline: float, rel_gap: Callable[[float], float], late: Callable[[], bool], reach: bool,
            most: int = _SWAP_ROUNDS) -> tuple[tuple[list[int], list[int], float], bool, bool]:
    """The column ILP over `outer`'s columns (every price's blocks: the last column ILP's alone find less) and
    the blocks one piece away from `best`'s, again from each faster answer, `most` rounds at most; with
    `reach`, without the columns `pinned.within_reach` rules out. Returns the best answer, whether it is new,
    and whether an ILP stopped at a limit."""
    ip = runs.ip
    cols, allowed = outer.points, outer.allowed
    cut, found = False, False
    for _ in range(most):
        if late():
            break
        cols = [undominated(a + b) for a, b in zip(cols, swap_columns(runs, options, best[0]))]
        outer = TwoLevel(ip, runs.dec)
        kept = pinned.within_reach(runs, cols, best[2] * (1 - GAP_TOLERANCE)) if reach else cols
        outer.points, outer.allowed = usable_columns(ip, runs.dec, kept, allowed, best[2]), allowed
        rnd = outer.outer("time", solver, deadline, best[2], rel_gap=rel_gap(best[2]), node_limit=_SWAP_NODES,
                          stall_nodes=_SWAP_STALL, work_limit=_SWAP_WORK)
        cut = cut or rnd.res.status not in ("optimal", "infeasible")
        if rnd.res.x is None or not rnd.value < best[2] or rnd.peak > ip.budget:
            break
        best, found = (rnd.choice, rnd.ckpt, rnd.value), True
    return best, found, cut


Options = list[dict[tuple, dict[tuple[int, ...], None]]]  # per piece: its end choices -> its node choices


def piece_options(runs: PricedRuns) -> list[Options]:
    """Per class, per piece: the node choices of that piece in the blocks priced along the way
    (`PricedRuns._blocks`), by the choices it starts and ends on (`BlockDP.piece_keys`; ordered sets)."""
    every = list(range(len(runs.priced)))
    out = []
    for cls, dp in enumerate(runs.dps):
        known = runs._blocks(every, cls)
        rows = first_rows(np.column_stack([known[:, 0], known[:, 3:]]))  # (p, choices) once each
        p, choice = rows[:, 0], rows[:, 1:]
        options: Options = []
        for carried, nodes, last, with_port in dp.pieces:
            none = np.full(len(rows), -1, dtype=np.int64)  # -1 stands for None in the key
            keys = np.column_stack([p if carried == PORT else choice[:, carried], p if with_port else none,
                                    none if last is None else choice[:, last], choice[:, nodes]])
            by_key: dict[tuple, dict[tuple[int, ...], None]] = {}
            for row in first_rows(keys).tolist():  # (key, piece choices) once each, in the order first found
                key = (row[0], None if row[1] < 0 else row[1], None if row[2] < 0 else row[2])
                by_key.setdefault(key, {})[tuple(row[3:])] = None
            options.append(by_key)
        out.append(options)
    return out


def swap_columns(runs: PricedRuns, options: list[Options], choice: list[int]) -> list[list[FrontierPoint]]:
    """Per class: the blocks one piece away from the blocks of `choice` (an assignment). A block is swept
    in pieces that meet only at one node's choice (`BlockDP.pieces`), so any piece of a block priced
    along the way (`options`, from `piece_options`) that starts and ends on the same choices as a piece of an
    answer block can replace it: the result is a block no single price made cheapest, measured exactly.
    Priced minimisers give whole blocks; an answer that mixes, in one layer, the attention of one price with
    the MLP of another (HF LLaMA on 2x2x2 at 1.25x its smallest budget: 3 % faster) is found this way."""
    out: list[list[FrontierPoint]] = []
    for cls, dp in enumerate(runs.dps):
        made = []
        for blk in (b for b, c in enumerate(runs.dec.block_class) if c == cls):
            port = runs.dec.ports[blk]
            p = choice[port] if port is not None else 0
            mine = np.array([choice[v] for v in runs.ip.block_nodes[blk]], dtype=np.int64)
            for k, key in enumerate(dp.piece_keys(p, mine)):
                for conf in options[cls][k].get(key, ()):
                    row = mine.copy()
                    row[dp.pieces[k][1]] = conf
                    made.append(np.concatenate([[p], row]))
        if not made:
            out.append([])
            continue
        u = first_rows(np.array(made, dtype=np.int64))
        q = u[:, 1 + dp.out] if dp.out is not None else np.zeros(len(u), dtype=np.int64)
        both = np.concatenate([u, u])
        flags = np.repeat([False, True], len(u))
        out.append(dp.make_points(both[:, 0], np.concatenate([q, q]), flags, both[:, 1:], undominated=True))
    return out
