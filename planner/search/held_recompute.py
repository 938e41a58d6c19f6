"""Rows for a checkpointed block's forward re-run, as the plan counts it: bounds from below of its peak.

The plan (`planner.plans.recompute.recomputation_peaks`) charges the re-run to the block's trigger op (its last op
that saves anything): beside the gradients alive there, over the block's ops in forward order, the activations
recomputed before the op, the intermediate outputs still to be read and not saved yet, and the op's own (what it
saves anew, its output, its forward buffers and the converted inputs it reads but does not save), or the forward
conversion into it beyond its source. The formulas' recompute rows (cumulative saved bytes plus each node's working
set) see neither the intermediates (hf-gpt2's GELU: the tanh branch's 256 KiB while the product reads it) nor the
gradients waiting, and count each node's whole working set where the plan counts only the forward's.

`forward_rows` writes one `HeldBeside` row per op of the block (and one per forward conversion into it), each
counting, per decision's choice (or pair of choices), only what the plan counts under every assignment with those
choices: an intermediate counts only where its op is never a view and nothing before the row's op may save it.
"""

from __future__ import annotations

from collections.abc import Callable

from cost_models.layout import Layout
from cost_models.memory import conversion_working_set
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, TensorMeta
from cost_models.redistribution import plan_redistribution
from cost_models.strategies.base import tensor_key
from cost_models.strategy import OpCost, Strategy
from cost_models.strides import is_identity
from planner.search.decisions import Decision, Enumerated, Grouped
from planner.search.held_saved import _MAY_VIEW, _arrives, _head, _is_output, _Saves
from planner.search.price_nodes import _out_layout, views_as_it_flows
from planner.search.solve.problem import Apart, HeldBeside
from planner.trace.graph import ModelGraph

__all__ = ["Alive", "Remade", "forward_rows"]

# kinds whose output may be a view of their input (`planner.plans.recompute`'s and `planner.plans.storage`'s tests):
# such an output is no new storage under some layouts, so it never counts as an intermediate here
_VIEWS = (*_MAY_VIEW, "split", "expand", "complex_view")

Vector = tuple[str, list[int]]
Pair = tuple[str, str, list[list[int]]]
# what a decision's ops save anew in its block's re-run (`held.held_beside`'s `recomputed`): bytes per choice, pair
# terms, apart terms
Remade = tuple[list[int], list[Pair], list[Apart]]
Recomputed = Callable[[Decision, str | None], Remade]
# the gradients alive at a block's trigger (`held.held_beside`'s `alive_at`): terms, floor, pair terms, apart terms
Alive = tuple[list[Vector], int, list[Pair], list[Apart]]


class _Block:
    """One block's ops in forward order, with what the rows need of each: who reads an op's output in the block,
    and which ops may save its storage (directly, through a view, or through an identity op)."""

    def __init__(self, ops: list[str], nodes: dict[str, OpNode], en: Enumerated, saves: _Saves) -> None:
        self.ops, self.pos = ops, {name: i for i, name in enumerate(ops)}
        self.last_read: dict[str, int] = {}
        for name in ops:
            for src in nodes[name].inputs:
                if src in self.pos:
                    self.last_read[src] = max(self.last_read.get(src, -1), self.pos[name])
        self.viewers: dict[str, list[str]] = {}  # op -> the ops of the block whose output may view its output
        for name in ops:
            src = nodes[name].inputs[:1]
            if src and src[0] in self.pos and saves.views_input(nodes[name]):
                self.viewers.setdefault(src[0], []).append(name)
        self.savers: dict[str, set[str]] = {}  # op -> the other ops of the block that may save its storage
        for name in ops:
            for cost in en.costs.get(name, ()):
                for t in cost.saved:
                    for made in {saves.storage(t.key)[1], _head(saves.tensor(t.key)) if _is_output(t.key) else None,
                                 _head(t.key) if _is_output(t.key) else None} - {None, name}:
                        self.savers.setdefault(made, set()).add(name)


class _Choices:
    """Per op, what each choice of its decision makes of it: strategies, costs, output bytes, whether it saves its own
    output; per argument read from another decision, tables over both decisions' choices."""

    def __init__(self, graph: ModelGraph, mesh: Mesh, en: Enumerated, g: Grouped, saves: _Saves) -> None:
        self.nodes = {n.name: n for n in graph.nodes}
        self.mesh, self.en, self.g, self.saves = mesh, en, g, saves
        self.arrives: dict[tuple[str, str, int], list[bool]] = {}
        self.memo: dict[tuple, int] = {}
        self.texts: dict[int, str] = {}

    def decision(self, name: str) -> tuple[Decision, int]:
        d = self.g.decisions[self.g.decision_of[name]]
        return d, d.ops.index(name)

    def strategies(self, name: str) -> list[Strategy]:
        d, k = self.decision(name)
        return [self.en.strategies[name][d.members[k][c]] for c in range(len(d.members[0]))]

    def costs(self, name: str) -> list[OpCost]:
        d, k = self.decision(name)
        return [self.en.costs[name][d.members[k][c]] for c in range(len(d.members[0]))]

    def out_bytes(self, name: str) -> list[int]:
        meta = self.nodes[name].out
        return [0 if s.outputs[0] is None else s.outputs[0].local_numel(meta.shape, self.mesh) * meta.itemsize
                for s in self.strategies(name)]

    def saves_own(self, name: str) -> list[bool]:
        return [any(_head(t.key) == name and _is_output(t.key) for t in c.saved) for c in self.costs(name)]

    def new_storage(self, op: OpNode) -> bool:
        """Whether `op`'s output is never a view of another op's output, whatever the layouts."""
        return (len(op.outputs) == 1 and op.kind not in _VIEWS and not is_identity(op)
                and op.name in self.g.decision_of and op.name in self.en.strategies)

    def by_pair(self, u: Decision, k_op: OpNode, arg: int, value: Callable[[bool, Layout | None, OpCost], int]
                ) -> list[list[int]]:
        """table[cu][ck]: value(arrives unconverted, the input layout k takes, k's cost) over both decisions' choices."""
        src = self.nodes[k_op.inputs[arg]]
        table = [[0] * len(self.strategies(k_op.name)) for _ in range(len(u.members[0]))]
        for ck, (strat, cost) in enumerate(zip(self.strategies(k_op.name), self.costs(k_op.name))):
            lv = strat.inputs[arg] if arg < len(strat.inputs) else None
            key = (src.name, k_op.name, id(lv))  # (the layouts live in `en` throughout)
            if key not in self.arrives:
                self.arrives[key] = _arrives(src, k_op, lv, self.en, self.g)[1]
            for cu, same in enumerate(self.arrives[key]):
                table[cu][ck] = value(same, lv, cost)
        return table

    def _text(self, layout: Layout) -> str:  # a layout's text, once per object (layouts hash by their text: slow)
        if id(layout) not in self.texts:
            self.texts[id(layout)] = str(layout)
        return self.texts[id(layout)]

    def _extra(self, meta: TensorMeta, lu: Layout, lv: Layout) -> int:
        """What the forward conversion lu -> lv holds beyond its source (the plan's `conv_extra`)."""
        key = (tuple(meta.shape), meta.itemsize, self._text(lu), self._text(lv))
        if key not in self.memo:
            shape = tuple(meta.shape)
            steps = plan_redistribution(shape, meta.itemsize, lu, lv, self.mesh)
            self.memo[key] = max(0, conversion_working_set(steps, shape, meta.itemsize, self.mesh)
                                 - lu.local_numel(shape, self.mesh) * meta.itemsize) if steps else 0
        return self.memo[key]

    def conversion(self, k_op: OpNode, arg: int, du: Decision, dk: Decision) -> Pair | None:
        """The forward conversion into argument `arg` of `k_op` beyond its source, over (du's choice, dk's choice)."""
        src, meta = k_op.inputs[arg], k_op.input_meta[arg]
        made = [_out_layout(s, self.nodes[src], k_op) for s in self.strategies(src)]
        takes = [s.inputs[arg] if arg < len(s.inputs) else None for s in self.strategies(k_op.name)]
        lus, lvs = list(dict.fromkeys(made)), list(dict.fromkeys(takes))
        small = {(i, j): 0 if lv is None or lv == lu else self._extra(meta, lu, lv)
                 for i, lu in enumerate(lus) for j, lv in enumerate(lvs)}
        iu, iv = {lu: i for i, lu in enumerate(lus)}, {lv: j for j, lv in enumerate(lvs)}
        conv = [[small[(iu[lu], iv[lv])] for lv in takes] for lu in made]
        return (du.name, dk.name, conv) if any(map(any, conv)) else None

    def unsaved(self, k_op: OpNode, arg: int, du: Decision, dk: Decision) -> Pair | None:
        """The converted copy of argument `arg` that `k_op` reads and does not save, over (du's choice, dk's choice)."""
        src, meta = k_op.inputs[arg], k_op.input_meta[arg]

        def copy_bytes(same: bool, lv: Layout | None, cost: OpCost) -> int:
            if same or lv is None or tensor_key(src, lv) in {x.key for x in cost.saved}:
                return 0
            return lv.local_numel(meta.shape, self.mesh) * meta.itemsize

        table = self.by_pair(du, k_op, arg, copy_bytes)
        return (du.name, dk.name, table) if any(map(any, table)) else None


def _kept_table(ch: _Choices, j_name: str, s_name: str) -> list[list[int]] | None:
    """Where op `s_name` saves op `j_name`'s output as it receives it, unconverted (then its own saves count it):
    table[cj][cs] over j's and s's decisions' choices (one decision: the diagonal counts). None where s may save that
    storage otherwise (through a view, or a copy it converts), which is not followed."""
    j_op, s_op = ch.nodes[j_name], ch.nodes[s_name]
    args = [a for a, src in enumerate(s_op.inputs) if src == j_name]
    direct = {tensor_key(j_name, st.inputs[a]) for st in ch.strategies(s_name) for a in args
              if a < len(st.inputs) and st.inputs[a] is not None}
    if not args or any((_head(x.key) == j_name or ch.saves.storage(x.key)[1] == j_name) and x.key not in direct
                       for c in ch.costs(s_name) for x in c.saved):
        return None

    def kept(same: bool, lv: Layout | None, cost: OpCost) -> int:
        return int(same and lv is not None and tensor_key(j_name, lv) in {x.key for x in cost.saved})

    (dj, _), (ds, _) = ch.decision(j_name), ch.decision(s_name)
    if dj is ds:  # one decision: j's output reaches s unconverted where s takes its layout
        n = len(ds.members[0])
        diag = [int(any(kept(st.inputs[a] == _out_layout(ch.strategies(j_name)[c], j_op, s_op), st.inputs[a], cost)
                        for a in args)) for c, (st, cost) in enumerate(zip(ch.strategies(s_name), ch.costs(s_name)))]
        return [[diag[c] if c == cs else 0 for cs in range(n)] for c in range(n)]
    tables = [ch.by_pair(dj, s_op, a, kept) for a in args]
    return [[int(any(tb[cj][cs] for tb in tables)) for cs in range(len(tables[0][0]))] for cj in range(len(tables[0]))]


def _read_through_view(ch: _Choices, blk: _Block, j_name: str, p: int) -> tuple[Decision, list[list[bool]]] | None:
    """Where op `j_name`'s output is read at or after position `p` only through one op that views it (the plan's
    `storage_bases`: an identity dropout or a view of it as it flows, unconverted): that op's decision and, over
    (j's decision's choice, its decision's choice), whether it views it; else None."""
    via = [r for r in blk.viewers.get(j_name, ()) if blk.last_read.get(r, -1) >= p and r in ch.g.decision_of
           and r in ch.en.strategies]
    if len(via) != 1:
        return None
    r_op, j_op = ch.nodes[via[0]], ch.nodes[j_name]
    dr, _ = ch.decision(via[0])
    made, takes = ch.strategies(j_name), ch.strategies(via[0])
    views = [[views_as_it_flows(r_op, j_op, st, mk, ch.nodes, ch.saves.device, ch.saves._memo) for st in takes]
             for mk in made]
    return dr, views


def _intermediates(ch: _Choices, blk: _Block, k_name: str, before: list[str]
                   ) -> tuple[list[int], list[Vector], list[Pair]]:
    """The intermediates still alive at op `k_name` of the re-run: an op's output not saved by itself, read at or after
    k; where one op (k, or one before it: BERT's MLP up projection, saving the residual add's input as it receives it
    where that arrives unconverted) may save it, only where that op does not (a pair term on whether it receives it
    unconverted); not where two or more may (nor where a decision counted whole, `before`, may). As (bytes on k's
    decision's choices, vectors, pair terms)."""
    dk, _ = ch.decision(k_name)
    p = blk.pos[k_name]
    live_own = [0] * len(dk.members[0])
    live_vec: list[Vector] = []
    live_pairs: list[Pair] = []

    def add(d: Decision, nbytes: list[int]) -> None:
        if d is dk:
            live_own[:] = [a + b for a, b in zip(live_own, nbytes)]
        elif any(nbytes):
            live_vec.append((d.name, nbytes))

    for j_name in blk.ops[:p]:
        j_op = ch.nodes[j_name]
        if not ch.new_storage(j_op):
            continue
        dj, _ = ch.decision(j_name)
        alive = [0 if s else n for s, n in zip(ch.saves_own(j_name), ch.out_bytes(j_name))]
        savers = [i for i in blk.savers.get(j_name, ()) if blk.pos[i] <= p or ch.g.decision_of[i] in before]
        if len(savers) > 1 or any(ch.g.decision_of[i] in before and blk.pos[i] > p for i in savers):
            continue
        if blk.last_read.get(j_name, -1) < p:  # read at or after k only through a view of it (an identity dropout)
            viewed = _read_through_view(ch, blk, j_name, p)
            if viewed is None:
                continue
            dr, views = viewed
            if dr is not dj:  # a pair term on the viewer's choice; not beside a saver's (three decisions)
                table = [[n if v else 0 for v in row] for n, row in zip(alive, views)]
                if not savers and any(map(any, table)):
                    live_pairs.append((dj.name, dr.name, table))
                continue
            alive = [n if views[c][c] else 0 for c, n in enumerate(alive)]
        if not savers:
            add(dj, alive)
            continue
        kept = _kept_table(ch, j_name, savers[0])
        if kept is None:
            continue
        ds, _ = ch.decision(savers[0])
        if dj is ds:
            add(dj, [0 if kept[c][c] else n for c, n in enumerate(alive)])
            continue
        table = [[0 if kept[cj][cs] else alive[cj] for cs in range(len(kept[0]))] for cj in range(len(alive))]
        if any(map(any, table)):
            live_pairs.append((dj.name, ds.name, table))
    return live_own, live_vec, live_pairs


def forward_rows(graph: ModelGraph, mesh: Mesh, en: Enumerated, g: Grouped, saves: _Saves,
                 triggers: dict[str, str], recomputed: Recomputed, order: dict[str, list[str]],
                 gradients: dict[str, Alive]) -> tuple[list[HeldBeside], list[str]]:
    """Per block with a fixed trigger (`held.recomputation_triggers`), per op of it: a row of what the plan counts
    at that op of the block's forward re-run (module docstring); and the blocks it wrote rows for. `recomputed(d, upto)`: what decision d's ops (up to
    op `upto`, all where None) save anew in the re-run, per choice, and the copies they save as pair terms
    (`held.held_beside`'s); `order`: per block, its decisions in order; `gradients`: per block, the gradients alive
    at its trigger's backward as (terms, floor, pair terms, apart terms)."""
    ch = _Choices(graph, mesh, en, g, saves)
    rows: list[HeldBeside] = []
    covered: list[str] = []
    for b in graph.blocks:
        if triggers.get(b.name) is None or b.name not in order:
            continue
        covered.append(b.name)
        blk = _Block([n for n in b.nodes if n in ch.nodes], ch.nodes, en, saves)
        names = order[b.name]
        grad_terms, floor, grad_pairs, grad_apart = gradients[b.name]
        for k_name in blk.ops:
            if k_name not in g.decision_of or k_name not in en.strategies:
                continue
            k_op, (dk, kk) = ch.nodes[k_name], ch.decision(k_name)
            if dk.block != b.name or dk.name not in names:
                continue
            before = names[:names.index(dk.name)]  # decisions counted whole (their ops all run before k's)
            n_k = len(dk.members[0])
            live_own, live_vec, live_pairs = _intermediates(ch, blk, k_name, before)
            earlier: list[Vector] = []
            copies: list[Pair] = []
            remade: list[Apart] = []
            for w in before:
                nbytes, more, also = recomputed(g.decisions[w], None)
                if any(nbytes):
                    earlier.append((w, nbytes))
                copies += more
                remade += also
            # the op's own: what it and its decision's ops before it save anew, its output (a new storage it does
            # not save), its forward buffers, and the converted inputs it reads but does not save
            mine, mine_copies, mine_apart = recomputed(dk, k_name)
            output = ch.out_bytes(k_name) if ch.new_storage(k_op) else [0] * n_k
            output = [0 if s else n for s, n in zip(ch.saves_own(k_name), output)]
            extra = [c.fwd_extra_bytes for c in ch.costs(k_name)]
            unsaved: list[Pair] = []
            conversions: list[Pair] = []
            for a, src in enumerate(k_op.inputs):
                if src not in g.decision_of or g.decision_of[src] == dk.name or k_op.inputs.count(src) > 1:
                    continue
                du = g.decisions[g.decision_of[src]]
                unsaved += [x for x in [ch.unsaved(k_op, a, du, dk)] if x is not None]
                conversions += [x for x in [ch.conversion(k_op, a, du, dk)] if x is not None]
            base = [x + y + z + w for x, y, z, w in zip(mine, output, extra, live_own)]
            rows.append(HeldBeside(dk.name, base, grad_terms, floor, True, None, grad_pairs, earlier + live_vec,
                                   copies + mine_copies + live_pairs + unsaved, grad_apart + remade + mine_apart))
            if conversions:  # the forward conversion into k, beside what was recomputed before it
                upto = dk.ops[kk - 1] if kk > 0 else None
                prior, prior_copies, prior_apart = recomputed(dk, upto) if upto is not None else ([0] * n_k, [], [])
                base = [x + w for x, w in zip(prior, live_own)]
                for conv in conversions:
                    rows.append(HeldBeside(dk.name, base, grad_terms, floor, True, None, grad_pairs, earlier + live_vec,
                                           copies + prior_copies + live_pairs + [conv],
                                           grad_apart + remade + prior_apart))
    return rows, covered
