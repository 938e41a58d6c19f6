"""Blocks and outer choices no price made cheapest on its own: the priced minima with one node pinned.

Every column the priced search hands the column ILP is a minimiser of one price: a point on the lower convex
hull of (time, bytes). At a tight budget the optimum is often inside the hull: on HF GPT-NeoX (2 layers, 2x2x2,
1.25x its smallest budget) it shards one layer's attention projection less and its LM head as 1d_col where
every priced minimiser kept it fsdp, a combination no price prefers. Pinning one node to one group of its
options (same scheme label and same bytes) and taking the minimiser under the price that proves the best bound
gives the cheapest assignment that uses that group; its blocks and outer choices join the columns, and the
column ILP (with the piece swaps, `planner.search.solve.piece_swaps`) mixes them. With them that plan reaches
the exact flat ILP's optimum (0.5039 -> 0.4906 ms; at 1.5x 0.3513 -> 0.3467 ms).

The pinned minimum also proves a bound for every assignment that uses the group (`price_bound`: a subset's
minimum is at least the whole's), so a group whose bound is at or above the answer to beat cannot be part of
a faster one and adds nothing (reduced-cost fixing).

A pin on a node inside a block pins that position in every block of its class (the blocks of a class share
one table); the columns are whole blocks, so the column ILP still mixes pinned and unpinned blocks per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from planner.search.solve.decompose import Decomposition
from planner.search.solve.frontier import FrontierPoint
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.priced_bound import price_bound
from planner.search.solve.priced_runs import PricedRuns

__all__ = ["pin_candidates", "pin_columns", "within_reach"]

_PINS = 400  # pins tried at most, in node order (a count: the plan does not depend on the machine's speed)
# Pins run only where the problem has at most this many blocks: with M blocks the column ILP already mixes
# whole blocks in steps of 1/M between two priced answers, so points inside the hull are within reach of it,
# and each pinned price sweeps the whole chain (gpt2-xl, 48 layers, on 4x4x4: 2 s of pins for a 0.5 % faster
# plan). The tiny HF models, where the gaps are, have two layers.
_PIN_BLOCKS = 4
_CHUNK = 24  # pins swept between two checks of the user's time limit


def pin_candidates(ip: IndexedProblem, dec: Decomposition) -> list[tuple[int, tuple[int, ...]]]:
    """(node, options) pins worth a minimum of their own: per labelled node outside the blocks and per labelled
    position of each block class (its first block's node), one pin per group of options with the same label
    and the same additive bytes (state + saved), where the node has more than one group."""
    nodes = [v for v in dec.outer_nodes if ip.labels[v] is not None]
    nodes += [v for c in dec.classes for v in ip.block_nodes[c.blocks[0]] if ip.labels[v] is not None]
    out = []
    for v in sorted(nodes):
        groups: dict[tuple[str, int], list[int]] = {}
        for j in range(ip.sizes[v]):
            groups.setdefault((str(ip.labels[v][j]), int(ip.state[v][j] + ip.saved[v][j])), []).append(j)
        if len(groups) > 1:
            out += [(v, tuple(js)) for js in groups.values()]
    return out


def pin_columns(runs: PricedRuns, below: float, late: Callable[[], bool]) -> int:
    """Record the minimisers of every pin (`pin_candidates`, _PINS at most; none where the problem has over
    _PIN_BLOCKS blocks) under the price that proved the best bound so far, and under that price with a
    checkpointed block's recomputed bytes priced the other way (at 1/M of the byte price, or not at all) where
    the first one's bound is below `below` (the answer to beat, less the gap that counts as optimal). Classes
    a pin does not touch keep those prices' tables (swept once). Returns how many were recorded; `late()`
    stops it. Keeping only the pins of the nodes with the largest byte spread (60 or 100 of 175) lost the
    GPT-NeoX optima above."""
    ip = runs.ip
    best = runs.best_proved()
    if best is None or len(ip.block_nodes) > _PIN_BLOCKS:
        return 0
    base = runs.priced[best].price
    bases = [base]
    m = len(ip.block_nodes)
    if ip.checkpointing and m:
        bases.append(replace(base, c=0.0 if base.c > 0 else base.b / m))
    pins = pin_candidates(ip, runs.dec)[:_PINS]
    for b in bases[1:]:
        if all(price != b for price, _ in runs.tables):
            runs.evaluate(b)  # recorded: its blocks are columns, and pinned prices share its tables
    known = {price: tables for price, tables in runs.tables if price in bases}  # a class no pin touches: as swept
    recorded = 0
    for start in range(0, len(pins), _CHUNK):
        if late():
            break
        chunk = pins[start:start + _CHUNK]
        firsts = runs._sweep_many([replace(base, pin=pin) for pin in chunk], known)
        # a pin whose bound reaches `below`: nothing that uses its group can beat the answer
        near = [(pin, first) for pin, first in zip(chunk, firsts)
                if price_bound(first[0].value, base, runs.floor, ip) < below]
        more = iter(runs._sweep_many([replace(b, pin=pin) for pin, _ in near for b in bases[1:]], known))
        for _, first in near:
            for r, tables in [first, *(next(more) for _ in bases[1:])]:
                runs._record(r, tables)
                recorded += 1
    return recorded


def within_reach(runs: PricedRuns, points: list[list[FrontierPoint]], below: float) -> list[list[FrontierPoint]]:
    """Per class, the columns of `points` that an assignment faster than `below` may use (reduced-cost fixing, exact).

    Under the price that proves the best bound, an assignment x that runs a block as column π with boundary
    (p, q) has a priced sum at least the least one plus π's reduced cost, its priced cost less the cheapest
    block's at (p, q) (put that block in its place: the rest of x is unchanged). So its time is at least the
    best bound plus that reduced cost, and a column whose reduced cost reaches `below` less the bound is in no
    faster answer."""
    i = runs.best_proved()
    if i is None:
        return points
    price, tables = runs.tables[i]
    slack = below - price_bound(runs.priced[i].value, price, runs.floor, runs.ip)
    out = []
    for dp, table, pts in zip(runs.dps, tables, points):
        if not pts:
            out.append(pts)
            continue
        reduced = dp.priced(price, pts) - table.cost[[pt.p for pt in pts], [pt.q for pt in pts]]
        out.append([pt for pt, keep in zip(pts, reduced < slack) if keep])
    return out
