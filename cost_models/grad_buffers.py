"""Activation gradients that autograd holds beyond the working set of the op it is differentiating.

The backward runs the ops in reverse. The gradient of a tensor exists from the backward of its last
consumer (the first the backward reaches) until the backward of its producer; each op's rule prices
only the gradients flowing into and out of it. Two kinds of gradient are alive beside those:

* waiting: while the backward differentiates op i, the gradient of every tensor produced before i and
  read by some op after i, where i itself does not read it: a residual stream's gradient while the
  branch beside it runs backward, the gradient of q from `qkv[0]` while `qkv[1]` and `qkv[2]` are
  differentiated.
* accumulation: when op i reads a tensor that an op after i reads too, autograd already holds that
  tensor's gradient buffer, and adds op i's contribution into a new tensor (buffer, contribution and
  sum alive at once). Measured on torch's TransformerEncoderLayer (8 gloo ranks, 3d_allreduce q/k/v
  projection): the three `select` ops on the packed (3, 16, 8, 64) q/k/v each build a zero-filled
  gradient of that size, and the second's sum with the first makes three such tensors alive together
  (294,912 B) beside the waiting q gradient and the residual stream's gradient (32,768 B each).

`gradient_buffers` gives, per op, the bytes alive beyond its own working set at its backward; the plan's
accounting (`planner.plans.assemble`) adds them to the op's transient.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from cost_models.edges import carries_gradient, grad_flow
from cost_models.ops import OpNode

__all__ = ["gradient_buffers", "gradients_alive", "held_groups", "identity_aliases", "passthrough_candidates",
           "tracked_gradients"]


def tracked_gradients(nodes: Sequence[OpNode]) -> list[str]:
    """The ops whose output's gradient `gradient_buffers` tracks: single-output ops (not the graph's inputs or
    output) whose output carries a gradient back (`grad_flow`, `carries_gradient`); a multi-output op, e.g.
    split, prices its parts' gradients itself."""
    flows = grad_flow(nodes)
    return [op.name for op in nodes if flows[op.name] and len(op.outputs) == 1
            and op.kind not in ("input", "output") and carries_gradient(op.out)]


def identity_aliases(nodes: Sequence[OpNode]) -> dict[str, str]:
    """Ops whose output is their input tensor itself (dropout with p = 0 or not training returns its
    input): op name -> the op that produced that tensor, so that saved-tensor keys naming either count once
    (the softmax output saved by softmax and by the attention matmul behind a p = 0 dropout)."""
    alias: dict[str, str] = {}
    for op in nodes:
        if op.kind == "dropout" and op.inputs and (float(op.attrs.get("p", 0.5)) == 0.0
                                                   or not op.attrs.get("training", True)):
            alias[op.name] = alias.get(op.inputs[0], op.inputs[0])
    return alias


def passthrough_candidates(nodes: Sequence[OpNode]) -> dict[str, tuple[OpNode, int]]:
    """Tensor -> (its last reader, the argument it is there), where that reader can hand its output's
    gradient back to it unchanged (the same storage) under some layouts: an identity dropout, or an add of
    a tensor of the output's shape (no broadcasting). It does where the tensor reaches it with no
    conversion (the plan's accounting checks that for the layouts chosen); every passthrough of any
    choice of layouts is here."""
    last: dict[str, OpNode] = {}
    for op in nodes:
        if op.kind != "output":
            for src in op.inputs:
                last[src] = op
    alias = identity_aliases(nodes)
    names = {op.name for op in nodes}
    out: dict[str, tuple[OpNode, int]] = {}
    for src, op in last.items():
        if op.name not in alias and (op.kind != "elementwise" or op.attrs.get("fn") != "add"):
            continue
        arg = op.inputs.index(src)
        if src in names and op.input_meta[arg].shape == op.out.shape:
            out[src] = (op, arg)
    return out


def held_groups(nodes: Sequence[OpNode]) -> tuple[list[tuple[dict[str, list[str]], list[str]]], dict[str, str]]:
    """What `gradient_buffers` can count beside each op's own working set, whatever the layouts: per op (forward
    order), the tracked tensors (`tracked_gradients`) whose gradients wait there or are its inputs' open
    buffers, by the storage they may share (root -> members; `passthrough_candidates`: every passthrough some
    layouts make, so a group of several may be one storage or several, a group of one is one), without the
    group of the op's own output, and the members of that group waiting there (they share the op's output's
    storage only where the op hands its gradient on unchanged: counted where its passthrough breaks); and each
    op's root (the group it is in). The solver's lower bound of those gradients (`planner.search.held`) counts
    a group of one at its tensor's bytes, a larger one at the least of its members'."""
    merges = {src: op.name for src, (op, _) in passthrough_candidates(nodes).items()}
    roots = {op.name: _root(op.name, merges) for op in nodes}
    out: list[tuple[dict[str, list[str]], list[str]]] = []
    for _, op, alive, _ in _sweep(nodes, dict.fromkeys(tracked_gradients(nodes), 0), merges):
        own = roots[op.name]
        out.append(({r: list(names) for r, (_, names) in alive.items() if r != own},
                    list(alive[own][1]) if own in alive else []))
    return out, roots


def _readers(nodes: Sequence[OpNode]) -> dict[str, list[int]]:
    """Producer name -> forward indices of the ops that read its output and send a gradient back (the
    graph's output node does not: the loss's gradient comes from outside)."""
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(nodes):
        if op.kind == "output":
            continue
        for src in dict.fromkeys(op.inputs):
            readers.setdefault(src, []).append(i)
    return readers


def _root(name: str, passthrough: dict[str, str]) -> str:
    """The tensor whose gradient storage `name`'s gradient is (itself unless passed through)."""
    seen = set()
    while name in passthrough and name not in seen:
        seen.add(name)
        name = passthrough[name]
    return name


def gradient_buffers(nodes: Sequence[OpNode], grad_bytes: dict[str, int], own_transient: Sequence[int],
                     passthrough: dict[str, str] | None = None,
                     also: Sequence[tuple[str, int] | None] | None = None) -> list[int]:
    """Per op (forward order): the bytes alive at its backward, its working set included: its own
    transient `own_transient[i]` plus the open gradient buffers of its inputs (a later op read them too),
    or those buffers plus one input's contribution and its sum, whichever is larger, plus every waiting
    gradient (see the module docstring).

    grad_bytes: producer name -> bytes of the gradient of its output on this rank (in the layout it
    produces), for single-output ops whose output carries a gradient; others are not tracked (a
    multi-output op, e.g. split, prices its parts' gradients itself).
    passthrough: tensor -> the op whose output's gradient storage its gradient is, when its last reader
    hands that gradient on unchanged (an add without broadcasting returns its output's gradient to both
    inputs; an identity dropout returns it as is): the two count once, and not at all beside the op
    whose own output's gradient it is (the op's working set prices that).
    also: per op, one more gradient alive there (the output gradient of op `name`, `nbytes`): a
    checkpointed block's gradient waiting through its recomputation; counted unless its storage is
    counted already (the op's own output gradient, an open buffer, a waiting gradient).
    """
    passthrough = passthrough or {}
    out: list[int] = []
    for i, op, alive, mine in _sweep(nodes, grad_bytes, passthrough):
        opened = sum(mine.values())
        work = max(own_transient[i] + opened, opened + 2 * max(mine.values(), default=0))
        skip = set(mine) | {_root(op.name, passthrough)}
        waiting = sum(nbytes for r, (nbytes, _) in alive.items() if r not in skip)
        extra = also[i] if also is not None else None
        if extra is not None and _root(extra[0], passthrough) not in skip | set(alive):
            waiting += extra[1]
        out.append(waiting + work)
    return out


def gradients_alive(nodes: Sequence[OpNode], grad_bytes: dict[str, int],
                    passthrough: dict[str, str] | None = None) -> list[int]:
    """Per op (forward order): the bytes of the activation gradients alive when the backward reaches it,
    before it runs: its own output's gradient, the open buffers of its inputs and every waiting gradient,
    each storage once (arguments as in `gradient_buffers`). What a checkpointed block's recomputation,
    which runs there, has beside it."""
    passthrough = passthrough or {}
    out: list[int] = []
    for _, op, alive, mine in _sweep(nodes, grad_bytes, passthrough):
        held = {r: nbytes for r, (nbytes, _) in alive.items()} | mine
        if op.name in grad_bytes:
            held.setdefault(_root(op.name, passthrough), grad_bytes[op.name])
        out.append(sum(held.values()))
    return out


def _sweep(nodes: Sequence[OpNode], grad_bytes: dict[str, int], passthrough: dict[str, str]
           ) -> Iterator[tuple[int, OpNode, dict[str, tuple[int, list[str]]], dict[str, int]]]:
    """Per op i (forward order): (i, op, the waiting gradients there (root -> (their bytes, the tensors
    waiting that share it)), the open buffers of its inputs (root -> bytes)); a sweep over the forward order."""
    readers = _readers(nodes)
    index = {op.name: i for i, op in enumerate(nodes)}
    # tensors waiting at op i: produced before i and last read after i
    starts: dict[int, list[str]] = {}
    ends: dict[int, list[str]] = {}
    for name in grad_bytes:
        users = readers.get(name)
        if not users or name not in index or index[name] + 1 > max(users) - 1:
            continue
        starts.setdefault(index[name] + 1, []).append(name)
        ends.setdefault(max(users) - 1, []).append(name)
    alive: dict[str, tuple[int, list[str]]] = {}  # root -> (the first waiting tensor's gradient bytes, those waiting)
    for i, op in enumerate(nodes):
        for name in starts.get(i, ()):
            alive.setdefault(_root(name, passthrough), (grad_bytes[name], []))[1].append(name)
        # the open buffers of the op's own inputs (a later op read them too)
        mine = {_root(src, passthrough): grad_bytes[src] for src in dict.fromkeys(op.inputs)
                if src in grad_bytes and max(readers.get(src, [i])) > i}
        yield i, op, alive, mine
        for name in ends.get(i, ()):
            r = _root(name, passthrough)
            alive[r][1].remove(name)
            if not alive[r][1]:
                del alive[r]
