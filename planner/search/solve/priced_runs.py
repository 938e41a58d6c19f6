"""What a priced search has found: every price's exact minimiser, its blocks' tables, and the columns.

`PricedRuns` evaluates prices (`PriceSweep`: exact minimum of a·time + b·additive bytes + c·recomputed
bytes over every assignment, under transient caps and label restrictions), records each minimiser with the
lower bound it proves, and turns the recorded blocks into the columns of the two-level outer ILP
(`planner.search.solve.two_level`): per block class, the cheapest block of each boundary under each price,
measured exactly, without dominated ones. `planner.search.solve.columns.PricedSolve` decides which prices to
evaluate and mixes the columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.search.solve.block_dp import BlockTable, Price, allowed
from planner.search.solve.decompose import Decomposition
from planner.search.solve.evaluate import FastEvaluator
from planner.search.solve.frontier import FrontierPoint
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.price_sweep import PriceSweep
from planner.search.solve.priced_bound import price_bound
from planner.search.solve.two_level import TwoLevel

__all__ = ["Priced", "PricedRuns", "first_rows"]

# Prices swept together at most (`evaluate_many`): one price's sweep is a few hundred array operations,
# mostly on small arrays; on GPT-3 175B's 4x4x4 mesh (tables of 52 x 52 x 33 choices) larger batches leave
# the cache and get slower again (least-memory search, CPU s: 6.0 one at a time, 5.2 by 3, 4.9 by 6, 5.2 by 12)
_BATCH = 6
_CAPS = 3  # transient caps tried below the best priced assignment's largest op transient


@dataclass
class Priced:
    """One price's exact minimiser: assignment, its exact time and peak, and the bound it proves."""

    price: Price
    choice: list[int]
    ckpt: list[int]
    boundary: list[tuple[int, int, int, bool]]  # per block: (class, p, q, checkpointed)
    time_s: float
    peak: int
    bound: float
    value: float = np.inf  # the minimum of the priced sum itself (what the bounds are built from)


class PricedRuns:
    """The prices evaluated for one decomposable problem, their minimisers (`priced`) and blocks (`tables`),
    and the column sets built from them (`_outer`)."""

    def __init__(self, ip: IndexedProblem, dec: Decomposition) -> None:
        self.ip, self.dec = ip, dec
        self.sweep = PriceSweep(ip, dec)
        self.dps = self.sweep.dps
        self.best_bound = -np.inf  # the best lower bound any priced minimum proved so far
        # the least max term an assignment that fits can have (raised by a subclass's floor search)
        self.floor = max((float(t.min()) for t in ip.transient), default=0.0)
        self.priced: list[Priced] = []
        self.tables: list[tuple[Price, list[BlockTable]]] = []
        self._levels: dict[tuple[str, ...], np.ndarray] = {}  # `_caps`'s transient levels per `only`
        self._evaluate = FastEvaluator(ip)  # the priced assignments' time and peak, as evaluate_indexed gives them
        self._block_rows: dict[tuple[tuple[int, ...], int], np.ndarray] = {}  # `_blocks` per (keep, class)
        self._column_sets: dict[tuple[int, ...], list[list[FrontierPoint]]] = {}  # `_columns` per keep

    def evaluate(self, price: Price, record: bool = True) -> Priced:
        """The exact minimiser of a·time + b·additive bytes (+ c·recomputed bytes) under `price`; with
        `record`, it joins the priced assignments (and its blocks the columns)."""
        return self.evaluate_many([price], record)[0]

    def evaluate_many(self, prices: list[Price], record: bool = True) -> list[Priced]:
        """`evaluate` of each of `prices`, swept together (`PriceSweep.tables_many`) and recorded in order."""
        out = []
        for r, tables in self._sweep_many(prices):
            if record:
                self._record(r, tables)
            out.append(r)
        return out

    def _sweep_many(self, prices: list[Price], known: dict[Price, list[BlockTable]] | None = None
                    ) -> list[tuple[Priced, list[BlockTable]]]:
        """Each price's exact minimiser and its blocks' tables, not recorded (`_record`); `known`: tables swept
        before, by price (`PriceSweep.tables_many`)."""
        if len(prices) > _BATCH:
            return [x for i in range(0, len(prices), _BATCH) for x in self._sweep_many(prices[i:i + _BATCH], known)]
        if not prices:
            return []
        tables = self.sweep.tables_many(prices, known)
        found = self.sweep.minimisers(prices, tables)
        out = []
        for price, tabs, (choice, ckpt, boundary, value) in zip(prices, tables, found):
            time_s, peak = self._evaluate(choice, ckpt)
            out.append((Priced(price, choice, ckpt, boundary, time_s, peak, self._bound(price, value), value), tabs))
        return out

    def _record(self, r: Priced, tables: list[BlockTable]) -> None:
        """`r` joins the priced assignments, and its blocks (`tables`) the columns."""
        self.tables.append((r.price, tables))
        self.priced.append(r)
        self.best_bound = max(self.best_bound, r.bound)

    def best_proved(self) -> int | None:
        """The index into `priced` (and `tables`) of the price whose minimum proved the best bound so far (the
        first of equals), or None when none proved one: where the bound searches and the pins start."""
        proved = [i for i, r in enumerate(self.priced) if np.isfinite(r.bound)]
        return max(proved, key=lambda i: self.priced[i].bound) if proved else None

    def _bound(self, price: Price, value: float) -> float:
        """The lower bound a price's minimum proves (`planner.search.solve.columns`), when c <= b / M, M the number of
        blocks: the max term is at least `floor` (`PricedSolve._raise_floor`) and at least the mean over all blocks of
        the activations a checkpointed block recomputes, so it is at least the mix (1 - cM/b)·floor +
        (c/b)·sum of those. -inf for prices that prove nothing (capped, restricted, pinned, a != 1)."""
        m = len(self.ip.block_nodes)
        valid = (price.a == 1.0 and price.cap == np.inf and not price.only and price.pin is None
                 and (price.c == 0.0 or price.c * m <= price.b * (1 + 1e-12)))
        return price_bound(value, price, self.floor, self.ip) if valid else -np.inf

    def _caps(self, choice: list[int], most: int = 0, only: tuple[str, ...] = ()) -> list[float]:
        """Up to _CAPS transient levels just below the largest op or conversion transient of `choice`: prices
        with these caps give columns (and outer choices) that trade a smaller max term for time or bytes.
        The levels are those of the options `only` allows (a uniform search's caps step through its own)."""
        ip = self.ip
        works = [e for e in ip.edges if e.transient is not None]
        top = max([int(ip.transient[v][c]) for v, c in enumerate(choice)]
                  + [int(e.transient[choice[e.src], choice[e.dst]]) for e in works], default=0)
        if only not in self._levels:  # the same for every choice: once per `only` (it was a quarter of the
            # least-memory search on gpt3-175b's 4x4x4 mesh, 2.8 of 10 s)
            masks = [allowed(labels, only) for labels in ip.labels]
            ok = [np.ones(len(t), bool) if m is None else m for t, m in zip(ip.transient, masks)]
            levels = [t[m] for t, m in zip(ip.transient, ok)]
            levels += [e.transient[np.ix_(ok[e.src], ok[e.dst])].ravel() for e in works]
            self._levels[only] = np.unique(np.concatenate(levels))
        below = self._levels[only]
        below = below[below < top]
        return [float(x) for x in below[::-1][:most or _CAPS]]

    def _outer(self, only: list[tuple[str, ...]] | None, picked: list[int] | None = None) -> TwoLevel:
        """The column ILP over the blocks that the prices restricted to one of `only` found (every price's
        when None; with `picked`, those priced assignments' only); the outer nodes and segment ends take the
        choices those priced assignments gave them."""
        keep = [i for i, r in enumerate(self.priced) if only is None or r.price.only in only] if picked is None \
            else picked
        runs = [self.priced[i] for i in keep]
        outer = TwoLevel(self.ip, self.dec)
        outer.points = self._columns(keep)
        used: dict[int, set[int]] = {}
        for r in runs:
            for v in self.dec.outer_nodes + [seg.out for seg in self.dec.segments if seg.out is not None]:
                used.setdefault(v, set()).add(r.choice[v])
        outer.allowed = {v: np.array(sorted(c), dtype=np.int64) for v, c in used.items()}
        return outer

    def _columns(self, keep: list[int]) -> list[list[FrontierPoint]]:
        """Per class: the blocks of the priced assignments `keep` (indices into `priced`: the cheapest blocks
        under each one's price), restricted to the boundary choices that one of them used (where the answer's
        blocks will join; a pinned price's, `planner.search.solve.pinned`, to the boundaries that start where
        one of its own blocks starts or end where one ends: there are hundreds of them), both plain and
        checkpointed, without dominated ones. Measured once per `keep` (the bound search and the piece swaps
        ask for every price's again; fresh lists each time)."""
        key = tuple(keep)
        if key not in self._column_sets:
            sets = []
            for cls, dp in enumerate(self.dps):
                u = self._blocks(keep, cls)
                sets.append(dp.make_points(u[:, 0], u[:, 1], u[:, 2].astype(bool), u[:, 3:], undominated=True))
            self._column_sets[key] = sets
        return [list(points) for points in self._column_sets[key]]

    def _blocks(self, keep: list[int], cls: int) -> np.ndarray:
        """Rows (p, q, checkpointed, node choices...) of the distinct blocks of class `cls` that `_columns`
        measures, in the order first found (once per `keep` and class: `piece_swaps` asks again)."""
        key = (tuple(keep), cls)
        if key not in self._block_rows:
            self._block_rows[key] = self._find_blocks(keep, cls)
        return self._block_rows[key]

    def _find_blocks(self, keep: list[int], cls: int) -> np.ndarray:
        dp = self.dps[cls]
        ends = np.array(sorted({x for i in keep for c, p, q, _ in self.priced[i].boundary if c == cls for x in (p, q)}),
                        dtype=np.int64)
        rows = []
        whole: set[int] = set()  # the tables read at every pair of `ends` (pinned prices share their unpinned ones')
        for i in keep:
            table = self.tables[i][1][cls]
            pinned = self.priced[i].price.pin is not None
            if pinned and id(table) in whole:
                continue  # its pairs are a subset of those read: the same rows, found before
            ps = ends[ends < table.cost.shape[0]]
            qs = ends[ends < table.cost.shape[1]]
            pairs = np.stack(np.meshgrid(ps, qs, indexing="ij"), axis=-1).reshape(-1, 2)
            if pinned:  # a pinned minimiser's blocks: where its own blocks start or end
                own = [(p, q) for c, p, q, _ in self.priced[i].boundary if c == cls]
                near = np.isin(pairs[:, 0], [p for p, _ in own]) | np.isin(pairs[:, 1], [q for _, q in own])
                pairs = pairs[near]
            else:
                whole.add(id(table))
            p, q, ckpt, choice = dp.blocks(table, pairs, both=True)
            rows.append(np.column_stack([p, q, ckpt, choice]))
        return first_rows(np.concatenate(rows) if rows else np.zeros((0, 3 + dp.n), dtype=np.int64))


def first_rows(rows: np.ndarray) -> np.ndarray:
    """The distinct rows of an integer array, in the order first found (rows compared as opaque bytes: np.unique
    over axis 0 takes four times as long)."""
    rows = np.ascontiguousarray(rows)
    if len(rows) == 0:
        return rows
    _, first = np.unique(rows.view(np.dtype((np.void, rows.itemsize * rows.shape[1]))).ravel(), return_index=True)
    return rows[np.sort(first)]
