"""Terms of the held rows (`planner.search.held`) counted only where a passthrough breaks.

Two activation gradients may be one storage: an add hands its output's gradient to an input unchanged, an identity
dropout hands it back as it is (`cost_models.grad_buffers.passthrough_candidates`), where the tensor reaches that
reader unconverted. Whether it does is set by the layouts of the decisions at both ends, so a gradient that may share
another's storage counts, in a row bounding the plan's accounting from below, only where a passthrough on either's way
to where they meet breaks: a term over one decision's choices, over a pair's, or an `Apart` term over more.
"""

from __future__ import annotations

from collections.abc import Mapping

from cost_models.ops import OpNode
from planner.search.solve.problem import Apart

__all__ = ["any_broken", "on_the_way", "only_where_broken", "where_any_breaks"]


def on_the_way(op: str, shared: list[str], links: Mapping[str, tuple[OpNode, int]]) -> list[str]:
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


def any_broken(terms: list[tuple[str, list[int]] | tuple[str, str, list[list[int]]]]
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


def only_where_broken(found: tuple[str, list[int]] | tuple[str, str, list[list[int]]], u: str, nbytes: list[int]
                      ) -> tuple:
    """A waiting gradient of nbytes[c] under choice c of decision `u`, counted only where `found` (a passthrough
    term, nonzero where it breaks) is nonzero: a term over u's choices, or a pair term, where `found` is set by at
    most one decision other than `u`; else an `Apart` term (u and the pair `found` is set by).
    Not its bytes, plus its most where the passthrough breaks, less that most: linear, but below zero where they
    share and its choice is not its largest (gpt-tiny's MLP projection, 2 KiB less 32 KiB: a row below the op's own
    working set, which let the held ILP's bound fall 52 % short of an answer's time)."""
    if len(found) == 2:
        a, vec = found
        if a == u:
            return u, [b if x else 0 for b, x in zip(nbytes, vec)]
        return u, a, [[b if x else 0 for x in vec] for b in nbytes]
    a, b, mat = found
    if u in (a, b):
        first = a == u
        return a, b, [[(nbytes[i] if first else nbytes[j]) if x else 0 for j, x in enumerate(row)]
                      for i, row in enumerate(mat)]
    return Apart(u, nbytes, [(a, b, [[x != 0 for x in row] for row in mat])])


def where_any_breaks(terms: list[tuple[str, list[int]] | tuple[str, str, list[list[int]]]], u: str, nbytes: list[int]
                     ) -> tuple:
    """A gradient of nbytes[c] under choice c of decision `u` counted where any of `terms` (passthroughs' terms,
    nonzero where one breaks) is: `only_where_broken` of their largest where at most two decisions set them, else an
    `Apart` term with one condition per pair of decisions (`any_broken`'s first term alone misses the others: the
    breaks on the other gradient's way, gpt-tiny's residual reaching the block's last add converted)."""
    if len({d for term in terms for d in term[:-1]}) <= 2:
        return only_where_broken(any_broken(terms), u, nbytes)
    by: dict[tuple, list] = {}
    for term in terms:
        by.setdefault(tuple(term[:-1]), []).append(term)
    conditions: list[tuple[str, str | None, list]] = []
    for same in by.values():
        m = any_broken(same)
        conditions.append((m[0], None, [x != 0 for x in m[1]]) if len(m) == 2
                          else (m[0], m[1], [[x != 0 for x in row] for row in m[2]]))
    return Apart(u, nbytes, conditions)
