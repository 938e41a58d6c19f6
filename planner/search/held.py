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
* the saved bytes the plan counts otherwise than the formulas: `planner.search.held_saved`.

The flat ILP adds them where asked (`build_flat(held=True)`: `fixing.prove`, once an answer without them was
refused). Each is a lower bound of what the plan counts, whatever the choices: a gradient handed on unchanged
by an add shares its storage with the add's output only under some layouts (`passthrough_candidates`), so a
group of tensors that may share one storage counts at the least of its members' bytes, or where the
passthrough breaks (a pair term); a saved tensor that may be a view of a storage saved before counts nothing.
"""

from __future__ import annotations

from cost_models.grad_buffers import held_groups, passthrough_candidates, tracked_gradients
from cost_models.mesh import Mesh
from cost_models.ops import OpNode
from cost_models.strides import is_identity
from planner.search.decisions import Decision, Enumerated, Grouped
from planner.search.held_apart import any_broken, on_the_way, where_any_breaks
from planner.search.held_recompute import Alive, Remade, forward_rows
from planner.search.held_saved import _MAY_VIEW, _arrives, _head, _is_output, _received, _Saves
from planner.search.solve.problem import Apart, HeldBeside
from planner.search.tied import tied_uses
from planner.trace.graph import ModelGraph

__all__ = ["held_beside", "recomputation_triggers"]


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


def held_beside(graph: ModelGraph, mesh: Mesh, en: Enumerated, g: Grouped, checkpointing: bool,
                device: str = "cuda") -> tuple[list[HeldBeside], list[str]]:
    """One row per op where gradients wait beside its working set (see the module docstring), and for an op
    of a block, where `checkpointing`, the same row at its block's recomputation (the recomputed activations
    beside it when the block is checkpointed: those of the decisions before its own, and its own decision's
    ops' up to it, at least what the plan counts: see `recomputed` below; `device`: the device kind, whose
    strides decide which reshapes view), for the ops up to the block's trigger op (`recomputation_triggers`;
    none where the choices could move it), with that op's output gradient, which waits through the
    recomputation; and the rows of each such block's forward re-run (`held_recompute.forward_rows`). Returns the rows
    and the blocks whose re-run they count (`Problem.held_rerun`)."""
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

    def place(found: tuple, into: dict[str, list[int]], pairs: list, apart: list[Apart]) -> None:
        """A term counted where passthroughs break (`where_any_breaks`) into a row's vectors, pairs or apart terms."""
        if isinstance(found, Apart):
            apart.append(found)
        elif len(found) == 2:
            add(into, *found)
        else:
            pairs.append(found)

    def apart_from(op: str, other: str, counted: str) -> tuple | None:
        """The gradient of `counted` (`op` or `other`) counted where it is apart from the other's, which may share its
        storage: where a passthrough on either's way to where they meet breaks (`where_any_breaks`); None where none
        can."""
        ways = [x for x in on_the_way(op, [other], links) + on_the_way(other, [op], links) if x in links]
        if not ways:
            return None
        u, nbytes = per_choice(counted, grad)
        return where_any_breaks([broken(nodes[x], max(nbytes)) for x in ways], u, nbytes)

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

    def root(key: str) -> str:
        """The op whose output a saved tensor is, behind views and ops that return their input itself."""
        sid, viewed = saves.storage(saves.tensor(key))
        return viewed or _head(sid)

    # per decision of a block: per tensor it may save (`_Saves.tensor`: through ops that return their input), and per
    # op whose output it may save a view of, the choices that do; and per block, its decisions in order
    tensors_saved: dict[str, dict[str, set[int]]] = {}
    views_saved: dict[str, dict[str, set[int]]] = {}
    block_order: dict[str, list[str]] = {}
    for d in g.decisions.values():
        if d.block is None or d.block not in inside:
            continue
        block_order.setdefault(d.block, []).append(d.name)
        tensors, views = tensors_saved[d.name], views_saved[d.name] = {}, {}
        for c in range(len(d.members[0])):
            for op, idx in zip(d.ops, d.members):
                for t in en.costs[op][idx[c]].saved:
                    tensors.setdefault(saves.tensor(t.key), set()).add(c)
                    if saves.storage(saves.tensor(t.key))[1] is not None:
                        views.setdefault(root(t.key), set()).add(c)

    def one_saver(key: str, d: Decision) -> tuple[str, tuple[bool, ...]] | None:
        """The earlier decision of d's block that alone may save the tensor a saved output `key` is (or a view of its
        op's output), and per its choice whether it saves neither: there d's save is a storage of its own in the
        re-run (`key` reaching d as it is made; converted, d keeps a copy of its own anyway). None where none or
        several may, or `key` is a view or made outside the block."""
        if not _is_output(key) or saves.storage(key)[1] is not None or root(key) not in inside[d.block]:
            return None
        tensor, made = saves.tensor(key), root(key)
        order = block_order[d.block]
        them = [e for e in order[:order.index(d.name)] if tensor in tensors_saved[e] or made in views_saved[e]]
        if len(them) != 1:
            return None
        e = them[0]
        saving = tensors_saved[e].get(tensor, set()) | views_saved[e].get(made, set())
        return e, tuple(ce not in saving for ce in range(len(g.decisions[e].members[0])))

    def recomputed(d: Decision, upto: str | None = None) -> Remade:
        """Per choice of decision `d` (of a block), what its ops (up to `upto`) save that its block's recomputation
        makes anew, at least: per storage (views counted as what they view) the most any of them saves, none that
        an earlier decision of the block may save, none from outside the block (kept by the checkpoint: the plan
        counts a kept storage saved again as nothing new). An input saved as the op receives it from another
        decision is a copy of its own where it reaches the op converted (the plan keeps `<key>@<op>`): those
        bytes are (input's decision, d, bytes[its choice][d's choice]) pairs, where it is not converted the
        rules above. A saved output that one earlier decision alone may save counts where that one's choice saves
        none of it (`one_saver`): a pair term, or with an input received, an `Apart` term (or where it arrives
        converted). As (bytes per choice, pair terms, apart terms)."""
        ops = d.ops if upto is None else d.ops[:d.ops.index(upto) + 1]
        out: list[int] = []
        n = len(d.members[0])
        tables: dict[str, list[list[int]]] = {}  # input's decision -> bytes[its choice][d's choice]
        # saved outputs an earlier decision alone may save (`one_saver`): (storage, it, the input's decision where d
        # receives it from another) -> (bytes per d's choice, per the input's choice and d's whether it arrives
        # converted)
        alone: dict[tuple, tuple[list[int], list[list[bool]] | None]] = {}
        for c in range(n):
            most: dict[str, int] = {}
            received: set[str] = set()
            roots_here: dict[str, set[str]] = {}  # what d saves of each tensor under this choice
            for op, idx in zip(ops, d.members):
                strat, node = en.strategies[op][idx[c]], nodes[op]
                for t in en.costs[op][idx[c]].saved:
                    base, anew = fresh(t.key, d)
                    roots_here.setdefault(root(t.key), set()).add(base)
                    arg = _received(t.key, node, strat, g, d)
                    e = None if anew else one_saver(t.key, d)
                    if arg is None:
                        if anew:
                            most[base] = max(most.get(base, 0), t.bytes)
                        elif e is not None:
                            nbytes = alone.setdefault((base, *e, None), ([0] * n, None))[0]
                            nbytes[c] = max(nbytes[c], t.bytes)
                        continue
                    if t.key in received:  # the same input as another op of d receives it: one storage at least
                        continue
                    received.add(t.key)
                    u, unconverted = _arrives(nodes[node.inputs[arg]], node, strat.inputs[arg], en, g)
                    if e is not None:
                        nbytes, conv = alone.setdefault((base, *e, u), ([0] * n, [[False] * n for _ in unconverted]))
                        nbytes[c] = max(nbytes[c], t.bytes)
                        for cu, same in enumerate(unconverted):
                            conv[cu][c] = not same
                        continue
                    table = tables.setdefault(u, [[0] * n for _ in unconverted])
                    for cu, same in enumerate(unconverted):
                        table[cu][c] += t.bytes if anew or not same else 0
            for (base, *_), (nbytes, _) in alone.items():  # d saving that tensor twice: one storage, or two
                if nbytes[c] and roots_here[root(base)] != {base}:
                    nbytes[c] = 0
            # a view and the output of the op it views may be one storage: the larger of them (not an op's own buffer:
            # hf-gpt2's MLP projection keeps its converted input beside the GELU's view of its output, 32 KiB)
            viewed = {sid[:-2] for sid in most if sid.endswith(":*")}
            groups: dict[str, int] = {}
            for sid, nbytes in most.items():
                group = sid[:-2] if sid.endswith(":*") else (_head(sid) if _is_output(sid) and _head(sid) in viewed
                                                             else sid)
                groups[group] = max(groups.get(group, 0), nbytes)
            out.append(sum(groups.values()))
        pairs = [(u, d.name, table) for u, table in tables.items() if any(map(any, table))]
        apart: list[Apart] = []
        for (_, e, spare, u), (nbytes, conv) in alone.items():
            if not any(nbytes):
                continue
            # anew where e's choice saves none of it (LLaMA's up projection saving the normed input that the gate
            # projection, before it, keeps only as a converted copy: 64 KiB in each layer's re-run), or where it
            # reaches d converted
            if u is None:
                pairs.append((e, d.name, [[b if free else 0 for b in nbytes] for free in spare]))
            else:
                apart.append(Apart(d.name, nbytes, [(e, None, list(spare)), (u, d.name, conv)]))
        return out, pairs, apart

    known: dict[tuple[str, str | None], Remade] = {}

    def recomputed_once(d: Decision, upto: str | None = None) -> Remade:
        """`recomputed`, each (decision, op) once: the rows at the backward and at the forward re-run ask alike."""
        if (d.name, upto) not in known:
            known[(d.name, upto)] = recomputed(d, upto)
        return known[(d.name, upto)]

    # per block: its decisions in order, each with what its recomputation makes anew
    in_block: dict[str, list[tuple[str, Remade]]] = {}
    if checkpointing:
        for d in g.decisions.values():
            if d.block is not None and d.block in inside:
                in_block.setdefault(d.block, []).append((d.name, recomputed_once(d)))

    groups, roots = held_groups(graph.nodes)
    links = passthrough_candidates(graph.nodes)

    def broken(op: OpNode, least: int | list[int]) -> tuple[str, list[int]] | tuple[str, str, list[list[int]]]:
        """`least` bytes (or least[c] under choice c of `op`'s decision) where `op`'s passthrough to its last reader
        breaks (its output reaches the reader converted): a vector over the choices of its decision where the reader
        is in it, else a matrix over both decisions' choices."""
        if isinstance(least, int):
            least = [least] * len(g.decisions[g.decision_of[op.name]].members[0])
        reader, arg = links[op.name]
        du, dr = g.decisions[g.decision_of[op.name]], g.decisions[g.decision_of[reader.name]]
        kr = dr.ops.index(reader.name)
        # per choice of the reader's decision: per choice of op's, whether the passthrough holds
        holds = []
        for cr in range(len(dr.members[0])):
            ins = en.strategies[reader.name][dr.members[kr][cr]].inputs
            holds.append(_arrives(op, reader, ins[arg] if arg < len(ins) else None, en, g)[1])
        if dr is du:
            return du.name, [0 if holds[c][c] else least[c] for c in range(len(holds))]
        return du.name, dr.name, [[0 if holds[cr][cu] else least[cu] for cr in range(len(holds))]
                                  for cu in range(len(holds[0]))]

    tracked = set(tracked_gradients(graph.nodes))

    def count_waiting(waiting: dict[str, list[str]], into: dict[str, list[int]]) -> int:
        """The gradients waiting at an op added to `into` by their producers' decisions; returns the floor of those
        groups that may be one storage or several, as the layouts choose (at least the least of them)."""
        floor = 0
        for group in waiting.values():
            if len(group) > 1:
                floor += min(min(per_choice(m, grad)[1]) for m in group)
            else:
                add(into, *per_choice(group[0], grad))
        return floor

    def alive_at(t: OpNode, waiting: dict[str, list[str]], shared: list[str]) -> Alive:
        """The gradients alive at trigger `t`'s backward, beside its block's forward re-run, as (terms, floor, pair
        terms, apart terms): those waiting there (a group that may be one storage at its least member), and `t`'s
        own: alone, or where one waiting gradient may share its storage, that one and `t`'s where a passthrough on
        its way to it breaks (gpt-tiny's MLP projection under 1d_row: its replicated output gradient, 32 KiB,
        apart from the residual stream's where the dropout after it hands its gradient to the residual add
        converted; counting only the projection's own passthrough, the rows missed it and the held ILP's optimum,
        1.7195 ms at 453,392 B on 8 ranks, was refused by the plan by 22,640 B)."""
        terms: dict[str, list[int]] = {}
        floor, pairs, apart = count_waiting(waiting, terms), [], []
        if not shared:
            if t.name in tracked:
                add(terms, *per_choice(t.name, grad))
        elif len(shared) == 1:
            add(terms, *per_choice(shared[0], grad))
            found = apart_from(t.name, shared[0], t.name) if t.name in tracked else None
            if found is not None:
                place(found, terms, pairs, apart)
        else:
            floor += min(min(per_choice(m, grad)[1]) for m in shared)
        return sorted((u, b) for u, b in terms.items() if any(b)), floor, pairs, apart

    triggers = recomputation_triggers(graph, en, g) if checkpointing else {}
    beside_trigger: dict[str, Alive] = {}
    rows: list[HeldBeside] = []
    seen: set[tuple] = set()
    for op, (waiting, shared) in zip(graph.nodes, groups):
        node = g.decision_of[op.name]
        work = per_choice(op.name, lambda name, k: en.costs[name][k].transient_bytes)[1]
        held: dict[str, list[int]] = {node: [0] * len(work)}  # the gradients waiting, by their producers' decisions
        floor = count_waiting(waiting, held)
        # the gradients sharing the op's output's storage where it hands its gradient on: apart where a passthrough on
        # its way to theirs breaks (one tensor: its bytes where it breaks, nothing where they share, `only_where_broken`;
        # several: the least of theirs where it breaks). gpt-tiny's MLP projection: the residual stream's
        # gradient waits beside it apart from its output's where the dropout after it hands its gradient to the
        # residual add converted, 32 KiB the op's own passthrough alone does not see.
        pairs: list[tuple[str, str, list[list[int]]]] = []
        apart: list[Apart] = []
        found = apart_from(op.name, shared[0], shared[0]) if len(shared) == 1 else None
        if found is not None:  # on either's way to where they meet
            place(found, held, pairs, apart)
        elif len(shared) > 1 and op.name in links:  # several: apart from all of theirs where the op's own way breaks
            least = min(min(per_choice(m, grad)[1]) for m in shared)
            place(any_broken([broken(nodes[x], least) for x in on_the_way(op.name, shared, links)]), held, pairs, apart)
        if checkpointing and triggers.get(op.block) == op.name:
            beside_trigger[op.block] = alive_at(op, waiting, shared)
        # at the recomputation: only ops of a block whose trigger is fixed, up to it (the plan counts no recomputed
        # activations beside the ops after it, differentiated before the recomputation)
        block = g.decisions[node].block
        t = triggers.get(block) if block is not None and op.block == block else None
        if t is None or index[op.name] > index[t]:
            block = None
        waits = block is not None and roots[t] not in waiting and roots[t] != roots[op.name]
        # ... and where it may share a waiting gradient's storage, apart where a passthrough on its way there breaks
        # (hf-gpt2's MLP dropout, whose gradient the residual add hands on: 8 KiB beside the MLP projection at the
        # recomputation, where the dropout's input and output layouts differ)
        joins = None
        if (block is not None and roots[t] in waiting and roots[t] != roots[op.name] and t not in waiting[roots[t]]
                and all(roots.get(src) != roots[t] for src in op.inputs)):
            if len(waiting[roots[t]]) == 1:  # one: apart where a passthrough on either's way breaks, t's bytes
                joins = apart_from(t, waiting[roots[t]][0], t)
            else:
                least = min(per_choice(t, grad)[1])
                ways = [broken(nodes[x], least) for x in on_the_way(t, waiting[roots[t]], links) if x in links]
                joins = any_broken(ways) if ways else None
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
            row_pairs, row_apart = list(pairs), list(apart)
            if recomputation and waits:
                add(terms, *per_choice(t, grad))
            elif recomputation and joins is not None:
                place(joins, terms, row_pairs, row_apart)
            rest = sorted((u, b) for u, b in terms.items() if u != node)
            mine, copies, remade = (recomputed_once(g.decisions[node], op.name) if recomputation
                                    else ([0] * len(work), [], []))
            earlier: list[tuple[str, list[int]]] = []
            if recomputation:
                order = [name for name, _ in in_block[block]]
                before_op = in_block[block][:order.index(node)]
                earlier = [(w, nbytes) for w, (nbytes, _, _) in before_op if any(nbytes)]
                copies = [x for _, (_, more, _) in before_op for x in more] + copies
                row_apart += [x for _, (_, _, more) in before_op for x in more] + remade
            for source in [None, *sources] if recomputation else [None]:
                base = work if source is None else [0] * len(work)  # the op's, or the conversion's on the edge
                own = [a + b + c for a, b, c in zip(base, terms[node], mine)]
                key = (node, tuple(own), tuple((u, tuple(b)) for u, b in rest), floor, recomputation, source,
                       tuple((a, b, tuple(map(tuple, m))) for a, b, m in row_pairs + copies),
                       repr(row_apart))
                if key not in seen:
                    seen.add(key)
                    rows.append(HeldBeside(node, own, rest, floor, recomputation, source, row_pairs, earlier, copies,
                                           row_apart))
    # the block's forward re-run, at its trigger: beside the gradients alive there (those waiting, and the trigger's
    # own where no waiting one may share its storage)
    order = {block: [name for name, _ in decisions] for block, decisions in in_block.items()}
    rerun, covered = forward_rows(graph, mesh, en, g, saves, triggers, recomputed_once, order, beside_trigger)
    return rows + rerun, covered
