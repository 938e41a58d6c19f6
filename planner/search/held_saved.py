"""What the plan counts as saved that the per-choice formulas count otherwise, as the flat ILP's held rows: bounds
from below of the plan's activation bytes (`planner.search.held` holds the gradients beside each op).

* `saved_copies`: the copies of an input decisions save beyond the problem's count-once (`HeldSaved`);
* `saved_twice`: what the formulas count in every layer, or at two decisions of a block, that the plan counts once
  (`HeldLess`, where the earlier decisions' choices save it);
* `saved_views`: a saved view the plan counts as the larger storage it views (`HeldLess`, negative).

`_Saves` answers, for both modules, which storage a saved tensor is and which earlier decisions may save it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.ops import OpNode
from cost_models.strategies.base import tensor_key
from cost_models.strategy import Strategy
from cost_models.strides import is_identity, is_view, runtime_strides
from planner.search.decisions import Decision, Enumerated, Grouped
from planner.search.price_nodes import _out_layout, views_as_it_flows
from planner.search.solve.problem import HeldLess, HeldSaved
from planner.trace.graph import ModelGraph

Clause = tuple[tuple[str, tuple[bool, ...]], ...]  # held where one of these decisions' choices is marked

__all__ = ["saved_copies", "saved_twice", "saved_views"]

# ops whose output may be a view of (or the very) tensor they read (`planner.plans.storage`,
# `planner.plans.recompute`): a saved tensor they make may be a storage saved before
_MAY_VIEW = ("contiguous", "permute", "getitem", "reshape", "split", "expand", "complex_view")


def _head(key: str) -> str:
    return key.partition(":")[0]


def _is_output(key: str) -> bool:
    """Whether saved-tensor key `key` is an op's output as it flows ("<op>:[layout]"), which a view of that output may
    share a storage with; not one of the op's own buffers ("<op>:<what>:...", e.g. a converted input it keeps) nor a
    converted copy ("<key>@<op>"), storages of their own."""
    rest = key.partition(":")[2]
    return rest.startswith("[") and "@" not in rest


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
    softmax's output behind a p=0 dropout). Each only where an earlier decision's choice saves it (the first: its
    storage, `_storages`, which the held rows must not leave counted: counting those views, HF GPT-NeoX's held proof on
    4x4x4 at 1.25x its smallest budget called 2.5187 ms optimal above a 2.5085 ms plan that fits) and it reaches this
    decision as it is made (`HeldLess.where`): where it reaches it converted, the decision saves a copy of its own,
    another storage (HF OPT's q, k and v on 4x4x4 each keep one of the layer norm's output; taken off, the held ILP's
    2.4474 ms answer at 1.5x the smallest budget counted 8 KiB under the plan, which refused it, and the plan stayed
    1.24 % unproven; HF BERT's first layer's q, k and v, the embeddings' output on 4x4x4: 8 KiB, 1.32 %). A tensor in another layout is another storage: taking those off too (any layout) left HF LLaMA's
    held rows below the formulas (64 ranks, 1.25x: 3.5914 -> 3.7157 ms, 4.4 % unproven). Per decision, those bytes
    per choice."""
    saves = _Saves(graph, en, g, device)
    nodes = saves.nodes
    in_blocks = {n for b in graph.blocks for n in b.nodes}
    # per decision: per tensor it may save, the choices that save it; and per block (and anywhere), its decisions so far
    saving: dict[str, dict[str, set[int]]] = {}
    storing: dict[str, dict[str, set[int]]] = {}  # the same per storage (`_Saves.storage`)
    so_far: dict[str | None, list[str]] = {}  # per block, and anywhere (None)
    for d in g.decisions.values():
        mine, kept = saving[d.name], storing[d.name] = {}, {}
        for c in range(len(d.members[0])):
            for op, idx in zip(d.ops, d.members):
                for t in en.costs[op][idx[c]].saved:
                    mine.setdefault(saves.tensor(t.key), set()).add(c)
                    for sid in _storages(saves, t.key):
                        kept.setdefault(sid, set()).add(c)

    def taken_off(key: str, d: Decision) -> Clause | bool:
        """False, True (whatever the choices), or the clause that one of the earlier decisions that may save `key`'s
        tensor (of d's block) or storage (made outside every block, earlier anywhere) does: taken off where it
        holds."""
        if d.block is None:
            return False
        if (saves.storage(key)[1] or _head(key)) not in in_blocks:
            return where_saved(so_far.get(None, ()), storing, _storages(saves, key, saved=False)) or False
        return where_saved(so_far.get(d.block, ()), saving, {saves.tensor(key)}) or False

    def where_saved(earlier: Iterable[str], table: dict[str, dict[str, set[int]]], names: set[str]) -> Clause:
        """The clause that one of the `earlier` decisions' choices saves one of `names` (per `table`)."""
        out = []
        for e in earlier:
            marks = set().union(*(table[e].get(x, ()) for x in names))
            if marks:
                out.append((e, tuple(ce in marks for ce in range(len(g.decisions[e].members[0])))))
        return tuple(out)

    less: list[HeldLess] = []
    for d in g.decisions.values():
        n = len(d.members[0])
        always = [0] * n
        where: dict[tuple, list[int]] = {}  # the clauses it is taken off where -> bytes per d's choice
        for c in range(n):
            counted: dict[str, tuple[int, str, int]] = {}  # the keys the problem counts here (`price_choices`)
            for op, idx in zip(d.ops, d.members):
                counted |= {t.key: (t.bytes, op, idx[c]) for t in en.costs[op][idx[c]].saved
                            if t.key not in before[d.name]}
            for key, (nbytes, op, k) in counted.items():
                off = taken_off(key, d)
                if off is True:
                    always[c] += nbytes
                    continue
                if not off:
                    continue
                clauses = [off]
                strat = en.strategies[op][k]
                arg = _received(key, nodes[op], strat, g, d)
                if arg is not None:  # one storage with theirs only where it reaches d as it is made; else d's own copy
                    u, same = _arrives(nodes[nodes[op].inputs[arg]], nodes[op], strat.inputs[arg], en, g)
                    if not any(same):
                        continue
                    if not all(same):
                        clauses.append(((u, tuple(same)),))
                where.setdefault(tuple(clauses), [0] * n)[c] += nbytes
        if any(always):
            less.append(HeldLess(d.name, always))
        less += [HeldLess(d.name, nbytes, [[(e, list(m)) for e, m in clause] for clause in clauses])
                 for clauses, nbytes in where.items()]
        if d.block is not None:
            so_far.setdefault(d.block, []).append(d.name)
        so_far.setdefault(None, []).append(d.name)
    return less


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


def _storages(saves: _Saves, key: str, saved: bool = True) -> set[str]:
    """The names of a saved tensor's storage (`saved`: as an earlier decision saves it) or of those it shares one with
    (as a later decision's, `_Saves.anew`'s test): a view of an op's output is "<op>:*", and shares with any view of it
    and with that output in any layout ("<op>:out"); that output in one layout, its key, shares with that key and with
    any view of it."""
    sid, viewed = saves.storage(key)
    if viewed is not None:
        return {sid} if saved else {sid, f"{viewed}:out"}
    if not _is_output(key):
        return {sid}
    return {sid, f"{_head(key)}:out"} if saved else {sid, f"{_head(key)}:*"}


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
                        if viewed is not None or _is_output(t.key):
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
        return sid, sid not in keys and not (_is_output(key) and _head(key) in views)
