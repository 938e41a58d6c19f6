"""What the plan's accounting counts and the per-choice formulas cannot, as the solver's rows: bounds from below.

The plan (`planner.plans.assemble`) counts, at every op's backward, the activation gradients waiting there (a
residual stream's while the branch beside it runs backward, q's while k and v are differentiated) and its
inputs' open buffers (`cost_models.grad_buffers.gradient_buffers`); at a checkpointed block's recomputation,
the activations recomputed so far, each storage once; and each converted input an op saves as a copy of its
own. Their bytes are set by other decisions' choices, so they are no cost of one decision: the formulas leave
them out, and an answer they deem optimal can be refused by the plan (HF LLaMA on 4x4x4 at 2x its smallest
budget: 7,872 B over, the residual stream's gradient and the MLP's output gradient beside the recomputation).

* `held_beside`: per op, a `HeldBeside` row: its working set (or its conversion's) plus each waiting gradient
  on its producer's decision, and at the recomputation the activations recomputed before it;
* `saved_copies`: the copies of an input decisions save beyond the problem's count-once (`HeldSaved`);
* `saved_twice`: what the formulas count in every layer that the plan counts once (`HeldLess`).

The flat ILP adds them where asked (`build_flat(held=True)`: `fixing.prove`, once an answer without them was
refused). Each is a lower bound of what the plan counts, whatever the choices: a gradient handed on unchanged
by an add shares its storage with the add's output only under some layouts (`passthrough_candidates`), so a
group of tensors that may share one storage counts at the least of its members' bytes, or where the
passthrough breaks (a pair term); a saved tensor that may be a view of a storage saved before counts nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from cost_models.grad_buffers import held_groups, passthrough_candidates
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode
from cost_models.strategies.base import tensor_key
from cost_models.strategy import Strategy
from cost_models.strides import is_identity, is_view, runtime_strides
from planner.search.decisions import Decision, Enumerated, Grouped
from planner.search.price_nodes import _out_layout, views_as_it_flows
from planner.search.solve.problem import HeldBeside, HeldLess, HeldSaved
from planner.search.tied import tied_uses
from planner.trace.graph import ModelGraph

__all__ = ["held_beside", "recomputation_triggers", "saved_copies", "saved_twice", "saved_views"]


# ops whose output may be a view of (or the very) tensor they read (`planner.plans.storage`,
# `planner.plans.recompute`): a saved tensor they make may be a storage saved before
_MAY_VIEW = ("contiguous", "permute", "getitem", "reshape", "split", "expand", "complex_view")


def _head(key: str) -> str:
    return key.partition(":")[0]


def _received(key: str, op: OpNode, strat: Strategy, g: Grouped, d: Decision) -> int | None:
    """The argument of `op` (of decision d, taking `strat`) whose input from another decision it saves as it
    receives it (saved-tensor key `key`), or None."""
    return next((a for a, src in enumerate(op.inputs) if a < len(strat.inputs) and strat.inputs[a] is not None
                 and g.decision_of[src] != d.name and key == tensor_key(src, strat.inputs[a])), None)


def _arrives(src: OpNode, reader: OpNode, want: Layout | None, en: Enumerated, g: Grouped) -> tuple[str, list[bool]]:
    """(the decision of `src`, per its choice whether `src`'s output reaches `reader` in layout `want`, unconverted)."""
    d = g.decisions[g.decision_of[src.name]]
    k = d.ops.index(src.name)
    return d.name, [want is not None and want == _out_layout(en.strategies[src.name][d.members[k][c]], src, reader)
                    for c in range(len(d.members[0]))]


def saved_copies(graph: ModelGraph, en: Enumerated, g: Grouped, before: Mapping[str, AbstractSet[str]]
                 ) -> list[HeldSaved]:
    """The copies of their inputs that decisions save beyond the problem's count: an op saving an input as it
    receives it from another decision, where the problem counts that tensor at an earlier decision only
    (`saved_before`: q, k and v saving the layer's normalized input), keeps a copy of its own where the input
    reaches it converted (the plan's `<key>@<op>`). Per (producer's decision, decision): those bytes per
    (producer's choice, decision's choice), once per tensor of a decision. `before`: the problem's `saved_before`."""
    nodes = {n.name: n for n in graph.nodes}
    tables: dict[tuple[str, str], list[list[int]]] = {}
    for d in g.decisions.values():
        n = len(d.members[0])
        for c in range(n):
            received: set[str] = set()
            for op, idx in zip(d.ops, d.members):
                strat, node = en.strategies[op][idx[c]], nodes[op]
                for t in en.costs[op][idx[c]].saved:
                    arg = _received(t.key, node, strat, g, d) if t.key in before[d.name] else None
                    if arg is None or t.key in received:
                        continue
                    received.add(t.key)
                    u, unconverted = _arrives(nodes[node.inputs[arg]], node, strat.inputs[arg], en, g)
                    table = tables.setdefault((u, d.name), [[0] * n for _ in unconverted])
                    for cu, same in enumerate(unconverted):
                        table[cu][c] += 0 if same else t.bytes
    return [HeldSaved(u, v, table) for (u, v), table in tables.items() if any(map(any, table))]


def saved_twice(graph: ModelGraph, en: Enumerated, g: Grouped, before: Mapping[str, AbstractSet[str]],
                device: str = "cuda") -> list[HeldLess]:
    """What the formulas count in a decision's saved bytes that the plan may count at an earlier one: a tensor the
    problem counts at a decision of a block (not at an earlier one of its block: `before`, the problem's
    `saved_before`) that an earlier decision may save: a storage made outside every block, by a decision anywhere
    (HF LLaMA's rotary tables, saved by every layer through views); a tensor made in the block, in the same layout,
    by a decision of the block, also behind ops that return their input itself (`_Saves.tensor`: HF BERT's q, k
    and v reading the layer norm's output behind an identity dropout, HF GPT-NeoX's attention matmul saving
    softmax's output behind a p=0 dropout). Taken off whatever the earlier decision's choice: where it does not
    save that tensor the rows count less than the plan, still a bound from below, which the flat ILP with held
    rows must be (counting those views, HF GPT-NeoX's held proof on 4x4x4 at 1.25x its smallest budget called
    2.5187 ms optimal above a 2.5085 ms plan that fits). A tensor in another layout is another storage: taking
    those off too (any layout) left HF LLaMA's held rows below the formulas (64 ranks, 1.25x: 3.5914 -> 3.7157
    ms, 4.4 % unproven). Per decision, those bytes per choice."""
    saves = _Saves(graph, en, g, device)
    anywhere = saves.earlier(per_block=False)
    in_blocks = {n for b in graph.blocks for n in b.nodes}
    # per decision of a block: per tensor it may save, the choices that save it; and per block, its decisions so far
    saving: dict[str, dict[str, set[int]]] = {}
    so_far: dict[str, list[str]] = {}
    for d in g.decisions.values():
        if d.block is None:
            continue
        mine = saving[d.name] = {}
        for c in range(len(d.members[0])):
            for op, idx in zip(d.ops, d.members):
                for t in en.costs[op][idx[c]].saved:
                    mine.setdefault(saves.tensor(t.key), set()).add(c)

    def taken_off(key: str, d: Decision) -> str | bool:
        """False, True (whatever the choices), or the one earlier decision of d's block that may save `key`'s
        tensor: taken off where its choice does."""
        if d.block is None:
            return False
        if (saves.storage(key)[1] or _head(key)) not in in_blocks:
            return not saves.anew(key, anywhere[d.name])[1]
        tensor = saves.tensor(key)
        savers = [e for e in so_far.get(d.block, ()) if tensor in saving[e]]
        return savers[0] if len(savers) == 1 else bool(savers)

    less: list[HeldLess] = []
    pairs: list[HeldSaved] = []
    for d in g.decisions.values():
        n = len(d.members[0])
        always = [0] * n
        tables: dict[str, list[list[int]]] = {}  # the one earlier saver's decision -> -bytes[its choice][d's choice]
        for c in range(n):
            counted: dict[str, int] = {}  # the keys the problem counts here (`price_choices`)
            for op, idx in zip(d.ops, d.members):
                counted |= {t.key: t.bytes for t in en.costs[op][idx[c]].saved if t.key not in before[d.name]}
            for key, nbytes in counted.items():
                off = taken_off(key, d)
                if off is True:
                    always[c] += nbytes
                elif off:
                    e = g.decisions[off]
                    table = tables.setdefault(off, [[0] * n for _ in range(len(e.members[0]))])
                    for ce in saving[off][saves.tensor(key)]:
                        table[ce][c] -= nbytes
        if any(always):
            less.append(HeldLess(d.name, always))
        pairs += [HeldSaved(e, d.name, table) for e, table in tables.items() if any(map(any, table))]
        if d.block is not None:
            so_far.setdefault(d.block, []).append(d.name)
    return less, pairs


def saved_views(graph: ModelGraph, mesh: Mesh, en: Enumerated, g: Grouped, before: Mapping[str, AbstractSet[str]],
                device: str = "cuda") -> list[HeldLess]:
    """What the plan counts beyond the formulas for a decision saving views of a larger storage: the plan counts
    a view as the whole storage it views (`planner.plans.assemble`), the formulas the view's bytes (HF BERT's
    position embedding saves its slice of the position-id buffer: 256 of the buffer's 512 B on 8x8). Only where
    that storage is set whatever the choices (the viewed op, the ops between and the reader's input as it flows
    have one option each, and each op views by the plan's test), and no other decision may save from it (the
    plan counts it once). As `HeldLess` entries of negative bytes: the flat ILP with held rows adds them."""
    saves = _Saves(graph, en, g, device)
    nodes, memo = saves.nodes, saves._memo

    def root(key: str) -> tuple[str, bool]:  # (the op whose output a saved tensor is or views, whether it views it)
        viewed = saves.storage(key)[1]
        return viewed or _head(key), viewed is not None

    savers: dict[str, set[str]] = {}  # op -> the decisions that may save its output or a view of it
    for d in g.decisions.values():
        for op, idx in zip(d.ops, d.members):
            for k in set(idx):
                for t in en.costs[op][k].saved:
                    savers.setdefault(root(t.key)[0], set()).add(d.name)

    def fixed(name: str) -> Strategy | None:
        d = g.decisions[g.decision_of[name]]
        return en.strategies[name][d.members[d.ops.index(name)][0]] if len(d.members[0]) == 1 else None

    def whole(key: str, viewed: str) -> int:
        """The bytes of the storage `viewed` where `key` is a view of it by the plan's test, else 0."""
        name = _head(key)
        strat = fixed(name)
        if strat is None or key != tensor_key(name, strat.outputs[0]) or len(nodes[name].outputs) != 1:
            return 0
        while name != viewed:
            op, src = nodes[name], nodes[nodes[name].inputs[0]]
            strat, made = fixed(name), fixed(src.name)
            if strat is None or made is None or not views_as_it_flows(op, src, strat, made, nodes, device, memo):
                return 0
            name = src.name
        meta = nodes[viewed].out
        return fixed(viewed).outputs[0].local_numel(meta.shape, mesh) * meta.itemsize

    out: list[HeldLess] = []
    for d in g.decisions.values():
        more = []
        for c in range(len(d.members[0])):
            counted: dict[str, dict[str, int]] = {}  # viewed op -> the keys the problem counts here and their bytes
            size: dict[str, int] = {}  # viewed op -> its storage's bytes (0 where a key is not a plain view of it)
            for op, idx in zip(d.ops, d.members):
                for t in en.costs[op][idx[c]].saved:
                    viewed, through_view = root(t.key)
                    if t.key in before[d.name] or savers[viewed] != {d.name}:
                        continue
                    counted.setdefault(viewed, {})[t.key] = t.bytes
                    own = whole(t.key, viewed) if through_view else 0
                    size[viewed] = min(size.get(viewed, own), own)
            more.append(-sum(max(0, size[v] - sum(keys.values())) for v, keys in counted.items()))
        if any(more):
            out.append(HeldLess(d.name, more))
    return out


def _apart(op: str, shared: list[str], links: Mapping[str, tuple[OpNode, int]]) -> list[str]:
    """The tensors on `op`'s path of passthroughs (each to its last reader, `passthrough_candidates`) up to where it
    meets the path of a gradient in `shared`, which may share its output gradient's storage: where any of their
    passthroughs breaks, `op`'s is apart from all of theirs."""
    def path(name: str) -> list[str]:
        out = [name]
        while out[-1] in links and links[out[-1]][0].name not in out:
            out.append(links[out[-1]][0].name)
        return out

    mine = path(op)
    theirs = {x for m in shared for x in path(m)}
    return mine[:next((i for i, x in enumerate(mine) if x in theirs), 1)]


def _any_broken(terms: list[tuple[str, list[int]] | tuple[str, str, list[list[int]]]]
                ) -> tuple[str, list[int]] | tuple[str, str, list[list[int]]]:
    """One term counting the most of `terms` (each a passthrough's: bytes per choice of a decision, or per pair of
    choices of two) under an assignment, where they are set by at most two decisions together; else the first.
    One row with the larger term, not one row per passthrough: rows per passthrough left HF LLaMA's held ILP on
    4x4x4 at 2x its smallest budget at its work limit, 16 % from its bound where it had proven its optimum."""
    names = list(dict.fromkeys(d for term in terms for d in term[:-1]))
    if len(names) > 2:
        return terms[0]
    sizes = {}
    for term in terms:
        table = term[-1]
        sizes[term[0]] = len(table)
        if len(term) == 3:
            sizes[term[1]] = len(table[0])

    def value(term: tuple, pick: dict[str, int]) -> int:
        table = term[-1]
        return table[pick[term[0]]] if len(term) == 2 else table[pick[term[0]]][pick[term[1]]]

    if len(names) == 1:
        (a,) = names
        return a, [max(value(t, {a: i}) for t in terms) for i in range(sizes[a])]
    a, b = names
    return a, b, [[max(value(t, {a: i, b: j}) for t in terms) for j in range(sizes[b])] for i in range(sizes[a])]


def recomputation_triggers(graph: ModelGraph, en: Enumerated, g: Grouped) -> dict[str, str]:
    """Block -> the op at whose backward the block, when checkpointed, re-runs its forward, whatever the
    choices: its last op that saves anything (`planner.plans.recompute`), where that op saves a storage no
    other op can save (fresh under every choice of its decision) and no later op of the block saves
    anything under any choice. Blocks where the choices could move it are left out."""
    nodes = {n.name: n for n in graph.nodes}
    tied = {use.user for use in tied_uses(graph)}
    heads: dict[str, set[str]] = {}  # storage head -> the ops that may save it
    for name, costs in en.costs.items():
        for cost in costs:
            for t in cost.saved:
                heads.setdefault(_head(t.key), set()).add(name)
    readers: dict[str, set[str]] = {}
    for op in graph.nodes:
        for src in op.inputs:
            readers.setdefault(src, set()).add(op.name)

    def only_mine(t, name: str) -> bool:
        """Whether saved tensor `t` of op `name` is a storage only `name` can save."""
        head = _head(t.key)
        src = nodes.get(head)
        if t.bytes <= 0 or src is None or src.kind in _MAY_VIEW or is_identity(src):
            return False
        views = {r for r in readers.get(head, ()) if nodes[r].kind in _MAY_VIEW or is_identity(nodes[r])}
        return all(heads.get(h, set()) <= {name} for h in {head} | views)

    out: dict[str, str] = {}
    for b in graph.blocks:
        savers = [n for n in b.nodes if n in en.costs and any(c.saved for c in en.costs[n])]
        if not savers or tied & set(b.nodes[b.nodes.index(savers[-1]):]):
            continue
        t = savers[-1]
        d = g.decisions[g.decision_of[t]]
        k = d.ops.index(t)
        if all(any(only_mine(x, t) for x in en.costs[t][idx].saved) for idx in set(d.members[k])):
            out[b.name] = t
    return out


class _Saves:
    """Which storage a saved tensor is, and which storages earlier decisions may save: the plan's accounting counts
    a storage once (`planner.plans.assemble`: a view as the storage it views, `planner.plans.storage`), where the
    problem's formulas count a saved tensor per key and block."""

    def __init__(self, graph: ModelGraph, en: Enumerated, g: Grouped, device: str) -> None:
        self.nodes = {n.name: n for n in graph.nodes}
        self.en, self.g, self.device = en, g, device
        self._memo: dict[str, tuple[int, ...] | None] = {}

    def views_input(self, op: OpNode) -> bool:
        """Whether `op`'s output may be a view of its first input: always for the kinds that view whatever the
        strides; a reshape or `contiguous` where the strides its input has at run time let it (`is_view`, the
        plan's rule; repeat_kv's reshape of an expand copies)."""
        if not op.inputs or op.inputs[0] not in self.nodes or not (op.kind in _MAY_VIEW or is_identity(op)):
            return False
        if op.kind in ("reshape", "contiguous") and not is_identity(op) and op.input_meta:
            return is_view(op, runtime_strides(op.inputs[0], self.nodes, self.device, self._memo))
        return True

    def storage(self, key: str) -> tuple[str, str | None]:
        """(the storage a saved tensor is, the op whose output it views or None): a tensor as it flows is its
        producer's output in that layout, a view one of the op it views (in a layout the choices set: any); an op's
        own buffer ("<op>:<what>:...", a layout conversion or statistics it keeps) is a storage of its own."""
        name, _, rest = key.partition(":")
        if not rest.startswith("[") or name not in self.nodes:
            return key, None
        viewed = name
        while viewed in self.nodes and self.views_input(self.nodes[viewed]):
            viewed = self.nodes[viewed].inputs[0]
        return (key, None) if viewed == name else (f"{viewed}:*", viewed)

    def earlier(self, per_block: bool) -> dict[str, tuple[set[str], set[str], set[str]]]:
        """Per decision, what the decisions before it (of its block, or anywhere) may save under some choice: the
        storages, the ops viewed, the ops saved from."""
        out: dict[str, tuple[set[str], set[str], set[str]]] = {}
        groups: dict[str | None, tuple[set[str], set[str], set[str]]] = {}
        for d in self.g.decisions.values():
            keys, views, heads = groups.setdefault(d.block if per_block else None, (set(), set(), set()))
            out[d.name] = (set(keys), set(views), set(heads))
            for op, idx in zip(d.ops, d.members):
                for k in set(idx):
                    for t in self.en.costs[op][k].saved:
                        sid, viewed = self.storage(t.key)
                        keys.add(sid)
                        heads.add(viewed or _head(t.key))
                        if viewed is not None:
                            views.add(viewed)
        return out

    def tensor(self, key: str) -> str:
        """The tensor a saved tensor is, through ops that return their input itself (`is_identity`: an identity
        dropout, a cast to its own dtype): the key of the first op before them, in the same layout. Two keys of
        one storage in one layout are the same tensor; views that change the shape are not followed."""
        name, sep, rest = key.partition(":")
        while name in self.nodes and is_identity(self.nodes[name]) and self.nodes[name].inputs[:1] \
                and self.nodes[name].inputs[0] in self.nodes:
            name = self.nodes[name].inputs[0]
        return f"{name}{sep}{rest}"

    def anew(self, key: str, earlier: tuple[set[str], set[str], set[str]]) -> tuple[str, bool]:
        """(its storage, whether no earlier decision (`earlier`, of `earlier()`) may save the storage of a saved
        tensor `key`: under a view, none may save from the op it views)."""
        sid, viewed = self.storage(key)
        keys, views, heads = earlier
        if viewed is not None:
            return sid, viewed not in heads
        return sid, sid not in keys and _head(key) not in views


def held_beside(graph: ModelGraph, mesh: Mesh, en: Enumerated, g: Grouped, checkpointing: bool,
                device: str = "cuda") -> list[HeldBeside]:
    """One row per op where gradients wait beside its working set (see the module docstring), and for an op
    of a block, where `checkpointing`, the same row at its block's recomputation (the recomputed activations
    beside it when the block is checkpointed: those of the decisions before its own, and its own decision's
    ops' up to it, at least what the plan counts: see `recomputed` below; `device`: the device kind, whose
    strides decide which reshapes view), for the ops up to the block's trigger op (`recomputation_triggers`;
    none where the choices could move it), with that op's output gradient, which waits through the
    recomputation."""
    nodes = {n.name: n for n in graph.nodes}
    index = {n.name: i for i, n in enumerate(graph.nodes)}

    def per_choice(name: str, value) -> tuple[str, list[int]]:
        d = g.decisions[g.decision_of[name]]
        k = d.ops.index(name)
        return d.name, [value(name, d.members[k][c]) for c in range(len(d.members[0]))]

    def grad(name: str, strategy: int) -> int:
        meta = nodes[name].out
        return en.strategies[name][strategy].outputs[0].local_numel(meta.shape, mesh) * meta.itemsize

    def add(into: dict[str, list[int]], node: str, nbytes: list[int]) -> None:
        into[node] = [a + b for a, b in zip(into.get(node, [0] * len(nbytes)), nbytes)]

    # (producer's decision, consumer's decision) -> the op-level conversions between them (op, argument)
    crossing: dict[tuple[str, str], int] = {}
    for op in graph.nodes:
        for src in op.inputs:
            pair = (g.decision_of[src], g.decision_of[op.name])
            if pair[0] != pair[1]:
                crossing[pair] = crossing.get(pair, 0) + 1

    inside = {b.name: set(b.nodes) for b in graph.blocks}

    saves = _Saves(graph, en, g, device)
    saved_earlier = saves.earlier(per_block=True)

    def fresh(key: str, d: Decision) -> tuple[str, bool]:
        """(its storage, whether decision d saving `key` makes that storage anew in its block's recomputation, for
        every choice of the decisions before it): made in the block (not kept from outside) and not saved by an
        earlier decision of the block (`_Saves.anew`)."""
        sid, anew = saves.anew(key, saved_earlier[d.name])
        return sid, anew and (saves.storage(key)[1] or _head(key)) in inside[d.block]

    def recomputed(d: Decision, upto: str | None = None) -> tuple[list[int], list[tuple[str, str, list[list[int]]]]]:
        """Per choice of decision `d` (of a block), what its ops (up to `upto`) save that its block's recomputation
        makes anew, at least: per storage (views counted as what they view) the most any of them saves, none that
        an earlier decision of the block may save, none from outside the block (kept by the checkpoint: the plan
        counts a kept storage saved again as nothing new). An input saved as the op receives it from another
        decision is a copy of its own where it reaches the op converted (the plan keeps `<key>@<op>`): those
        bytes are (input's decision, d, bytes[its choice][d's choice]) pairs, where it is not converted the
        rules above."""
        ops = d.ops if upto is None else d.ops[:d.ops.index(upto) + 1]
        out: list[int] = []
        n = len(d.members[0])
        tables: dict[str, list[list[int]]] = {}  # input's decision -> bytes[its choice][d's choice]
        for c in range(n):
            most: dict[str, int] = {}
            received: set[str] = set()
            for op, idx in zip(ops, d.members):
                strat, node = en.strategies[op][idx[c]], nodes[op]
                for t in en.costs[op][idx[c]].saved:
                    base, anew = fresh(t.key, d)
                    arg = _received(t.key, node, strat, g, d)
                    if arg is None:
                        if anew:
                            most[base] = max(most.get(base, 0), t.bytes)
                        continue
                    if t.key in received:  # the same input as another op of d receives it: one storage at least
                        continue
                    received.add(t.key)
                    u, unconverted = _arrives(nodes[node.inputs[arg]], node, strat.inputs[arg], en, g)
                    table = tables.setdefault(u, [[0] * n for _ in unconverted])
                    for cu, same in enumerate(unconverted):
                        table[cu][c] += t.bytes if anew or not same else 0
            # a view and a tensor of the op it views may be one storage: the larger of them
            viewed = {sid[:-2] for sid in most if sid.endswith(":*")}
            groups: dict[str, int] = {}
            for sid, nbytes in most.items():
                group = sid[:-2] if sid.endswith(":*") else (_head(sid) if _head(sid) in viewed else sid)
                groups[group] = max(groups.get(group, 0), nbytes)
            out.append(sum(groups.values()))
        return out, [(u, d.name, table) for u, table in tables.items() if any(map(any, table))]

    # per block: its decisions in order, each with what its recomputation makes anew
    in_block: dict[str, list[tuple[str, tuple[list[int], list[tuple[str, str, list[list[int]]]]]]]] = {}
    if checkpointing:
        for d in g.decisions.values():
            if d.block is not None and d.block in inside:
                in_block.setdefault(d.block, []).append((d.name, recomputed(d)))

    groups, roots = held_groups(graph.nodes)
    links = passthrough_candidates(graph.nodes)

    def broken(op: OpNode, least: int) -> tuple[str, list[int]] | tuple[str, str, list[list[int]]]:
        """`least` bytes where `op`'s passthrough to its last reader breaks (its output reaches the reader
        converted): a vector over the choices of its decision where the reader is in it, else a matrix over
        both decisions' choices."""
        reader, arg = links[op.name]
        du, dr = g.decisions[g.decision_of[op.name]], g.decisions[g.decision_of[reader.name]]
        kr = dr.ops.index(reader.name)
        # per choice of the reader's decision: per choice of op's, whether the passthrough holds
        holds = []
        for cr in range(len(dr.members[0])):
            ins = en.strategies[reader.name][dr.members[kr][cr]].inputs
            holds.append(_arrives(op, reader, ins[arg] if arg < len(ins) else None, en, g)[1])
        if dr is du:
            return du.name, [0 if holds[c][c] else least for c in range(len(holds))]
        return du.name, dr.name, [[0 if holds[cr][cu] else least for cr in range(len(holds))]
                                  for cu in range(len(holds[0]))]

    triggers = recomputation_triggers(graph, en, g) if checkpointing else {}
    rows: list[HeldBeside] = []
    seen: set[tuple] = set()
    for op, (waiting, shared) in zip(graph.nodes, groups):
        node = g.decision_of[op.name]
        work = per_choice(op.name, lambda name, k: en.costs[name][k].transient_bytes)[1]
        held: dict[str, list[int]] = {node: [0] * len(work)}  # the gradients waiting, by their producers' decisions
        floor = 0
        for group in waiting.values():
            if len(group) > 1:  # one storage or several, as the layouts choose: at least the least of them
                floor += min(min(per_choice(m, grad)[1]) for m in group)
            else:
                add(held, *per_choice(group[0], grad))
        # the gradients sharing the op's output's storage where it hands its gradient on: apart where a passthrough on
        # its way to theirs breaks (one tensor: its bytes, less its most where they share, which no row needs: exact
        # at every assignment; several: the least of theirs). gpt-tiny's MLP projection: the residual stream's
        # gradient waits beside it apart from its output's where the dropout after it hands its gradient to the
        # residual add converted, 32 KiB the op's own passthrough alone does not see.
        pairs: list[tuple[str, str, list[list[int]]]] = []
        if shared and op.name in links:
            if len(shared) == 1:
                u, nbytes = per_choice(shared[0], grad)
                add(held, u, nbytes)
                floor -= max(nbytes)
                least = max(nbytes)
            else:
                least = min(min(per_choice(m, grad)[1]) for m in shared)
            found = _any_broken([broken(nodes[x], least) for x in _apart(op.name, shared, links)])
            if len(found) == 2:
                add(held, *found)
            else:
                pairs.append(found)
        # at the recomputation: only ops of a block whose trigger is fixed, up to it (the plan counts no recomputed
        # activations beside the ops after it, differentiated before the recomputation)
        block = g.decisions[node].block
        t = triggers.get(block) if block is not None and op.block == block else None
        if t is None or index[op.name] > index[t]:
            block = None
        waits = block is not None and roots[t] not in waiting and roots[t] != roots[op.name]
        # the op's own working set, or, at the recomputation, the conversion into it from a decision it is the
        # only conversion from (elsewhere the plan takes what the op saves off a conversion's working set, the
        # storages it keeps: views and converted copies can make that more than the rule's saved bytes, which the
        # problem's edge takes off)
        sources = [u for u in dict.fromkeys(g.decision_of[src] for src in op.inputs)
                   if u != node and crossing[(u, node)] == 1]
        for recomputation in (False, True):
            if recomputation and block is None:
                continue
            if not recomputation and not waiting and not shared:
                continue  # nothing beyond the op's own working set, which the node's transient counts
            terms = dict(held)
            if recomputation and waits:
                add(terms, *per_choice(t, grad))
            rest = sorted((u, b) for u, b in terms.items() if u != node)
            mine, copies = recomputed(g.decisions[node], op.name) if recomputation else ([0] * len(work), [])
            earlier: list[tuple[str, list[int]]] = []
            if recomputation:
                order = [name for name, _ in in_block[block]]
                before_op = in_block[block][:order.index(node)]
                earlier = [(w, nbytes) for w, (nbytes, _) in before_op if any(nbytes)]
                copies = [x for _, (_, more) in before_op for x in more] + copies
            for source in [None, *sources] if recomputation else [None]:
                base = work if source is None else [0] * len(work)  # the op's, or the conversion's on the edge
                own = [a + b + c for a, b, c in zip(base, terms[node], mine)]
                key = (node, tuple(own), tuple((u, tuple(b)) for u, b in rest), floor, recomputation, source,
                       tuple((a, b, tuple(map(tuple, m))) for a, b, m in pairs + copies))
                if key not in seen:
                    seen.add(key)
                    rows.append(HeldBeside(node, own, rest, floor, recomputation, source, pairs, earlier, copies))
    return rows
