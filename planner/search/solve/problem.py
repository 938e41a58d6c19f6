"""The optimisation problem the solvers see: plain numbers, no torch, no layouts.

The plan builder (`planner.search.build`) turns a captured graph and its costed strategies into a `Problem`:
one `ProblemNode` per decision (a heavy op together with the element-wise and shape ops that follow it),
one `ProblemEdge` per data dependency between decisions with a redistribution-cost matrix, and the
checkpointable blocks. Solvers return a `Solution`. Keeping this boundary numeric lets the solvers be
tested against brute force on random instances.

Memory model (per rank, bytes), for a choice of one option per node and a set C of checkpointed blocks:

    peak = sum_v state[v]                                    (model states)
         + sum_{v not in a block of C} saved[v]               (saved activations)
         + sum_e saved[e][choice(src), choice(dst)]             (what a node outside the blocks saves
                                                               that depends on both ends: a tied
                                                               weight's copy in its user's layout)
         + sum_{b in C} input_bytes[b][choice of b.input_node] (a checkpointed block keeps its input)
         + sum_{s: C meets s.blocks} s.nbytes[choice of s.node]  (tensors several blocks read beside
                                                               their input, kept once while any of them
                                                               is checkpointed: `SharedInput`)
         + max( max_v transient[v],                            (largest temporary buffer)
                max_e transient[e][choice(src), choice(dst)],  (a layout conversion's working set)
                max_{b in C} max_{v in b} ( sum_{u in b, u <= v} saved[u]  (a checkpointed block's
                                            + work[v] ) )      recompute peak: at v's backward, the
                                                               activations recomputed up to v, in the
                                                               block's order, beside v's working set)
    where work[v] = max(transient[v], transient[e] of the edges e into v), and a block's order is the order
    its nodes are listed in, where every edge inside it runs forward (otherwise, among the nodes ready
    next, the first listed: `IndexedProblem`). The plan's accounting adds the same per op, in the graph's
    order; a node holds several ops, which it counts together.

The shared-input term couples blocks; the flat and column ILPs, `evaluate` and brute force count it
exactly, while the priced search's per-block prices leave it out (a relaxation: its lower bounds stay
valid, and every priced answer is measured with the whole formula before it counts).

Time (seconds of one training step):

    time = sum_v time[v] + sum_e cost[e][choice(src), choice(dst)]
         + sum_{b in C} ( sum_{v in b} recompute[v] + sum_{e into or inside b} recompute[e][.,.] )
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

__all__ = ["Choice", "ProblemNode", "ProblemEdge", "Block", "SharedInput", "Apart", "HeldBeside", "HeldLess", "HeldSaved", "OptimizerStep", "Problem", "Solution", "GAP_TOLERANCE", "FORMULAS_ONLY", "NOT_PROVEN", "relative_gap"]


@dataclass(frozen=True)
class Choice:
    """One option of one node: its seconds and bytes (see the module docstring)."""

    time_s: float
    recompute_s: float
    state_bytes: int
    saved_bytes: int
    transient_bytes: int


@dataclass
class ProblemNode:
    """A decision: its options, its block, and optionally a label per option (the scheme of its heavy
    op): a solver may look for good assignments that use one group of labels throughout."""

    name: str
    choices: list[Choice]
    block: str | None = None
    labels: list[str] | None = None


@dataclass
class ProblemEdge:
    """Data flowing from node `src` to node `dst`; cost_s[i, j] is the redistribution time (forward +
    backward) when src takes choice i and dst choice j; recompute_s[i, j] the extra when dst's block is
    checkpointed (the forward part runs again); transient_bytes[i, j] the working set of that
    conversion (its staging buffers and output), a candidate for the max term (None: no conversion
    needs memory); saved_bytes[i, j] what `dst` saves for its backward beyond its own choice's saved
    bytes, alive all step like them (a tied weight's copy, `planner.search.tied`; None: nothing). Only
    an edge into a node outside every block may save bytes: a checkpointed block recomputes what its
    nodes save, which no edge term follows. transient_bytes_unckpt[i, j]: the working set where `dst`'s block
    is not checkpointed, less what `dst` saves, which is not alive beside the conversion then (the plan's
    accounting; None: transient_bytes). The formulas count transient_bytes (an upper bound); the flat ILP
    with held rows, a lower bound of the plan, counts this one beside them (`build_flat(held=True)`)."""

    src: str
    dst: str
    cost_s: np.ndarray
    recompute_s: np.ndarray
    transient_bytes: np.ndarray | None = None
    saved_bytes: np.ndarray | None = None
    transient_bytes_unckpt: np.ndarray | None = None


@dataclass
class Block:
    """A checkpointable block: its nodes, and the node outside it that feeds it, whose output it keeps
    when checkpointed (input_bytes[i] when that node takes choice i). `cls` groups identical blocks
    (same ops, shapes and costs) so the solver may exploit the repetition."""

    name: str
    nodes: list[str]
    input_node: str | None
    input_bytes: list[int]
    cls: str = ""


@dataclass
class SharedInput:
    """A tensor made outside the blocks that blocks read beside their input (HF LLaMA's rotary cos and sin
    and its attention mask, T5's encoder output read by every decoder layer): node `node`'s output, of
    nbytes[i] on a rank when that node takes choice i. A checkpointed block keeps what it reads, so the
    tensor stays alive all step once any of `blocks` is checkpointed, and counts once however many are."""

    node: str
    nbytes: list[int]
    blocks: list[str]


class Apart(NamedTuple):
    """A gradient of nbytes[k] under node `node`'s choice k, counted only where any of `conditions` holds: each
    (node a, None, breaks[i]) true where a takes i, or (node a, node b, breaks[i][j]) true where a takes i and b
    takes j. A gradient apart from another's storage where any passthrough on either's way to where they meet
    breaks: gpt-tiny's MLP projection under 1d_row, whose output gradient shares the residual stream's unless the
    dropout after it or the residual reaching the block's last add is converted."""

    node: str
    nbytes: list[int]
    conditions: list[tuple[str, str | None, list]]


@dataclass
class HeldBeside:
    """Bytes the backward holds beside one op's working set that other nodes' choices set: the activation
    gradients waiting there (`planner.search.held`). At that op of node `node`: its working set own[c] under
    `node`'s choice c, plus nbytes[j] for each (other node, nbytes) in `held` taking choice j, plus `floor`.
    With `recomputation`, the op is where its checkpointed block re-runs its forward: the row holds only when
    `node`'s block is checkpointed, beside the activations the block recomputes before the op: per (earlier node of
    the block, nbytes) in `recomputed`, nbytes[j] under its choice j, and those of `node`'s own ops up to the op in
    `own` (at least what the plan counts: kept storages saved again left out), and per (a, b, nbytes) in
    `recomputed_pairs`, nbytes[i][j] where a takes i and b takes j (a view of a kept tensor that is a storage of
    its own where its input reaches it converted). With
    `conversion_from`, the working set is that of the conversion into the op from that node (the problem's
    edge between the two, of which it is the only conversion) beside `own` (then only the gradients of `node`'s
    own ops). `pairs`: (node a, node b, nbytes[i][j]) bytes held where a takes choice i and b choice j (a gradient
    sharing the op's output's storage unless the op's passthrough breaks, which both ends' layouts decide). `apart`:
    `Apart` terms, each a gradient counted only where one of its conditions holds (a product of three choices or
    more). `floor`
    may be negative (a term counted only under a condition written linearly: its bytes plus its most where the
    condition holds, less that most; `planner.search.held` writes `apart` terms instead, which never go below zero).

    A lower bound of what the plan's accounting counts there, which the formulas (`evaluate`) leave out: the
    flat ILP adds each as one more candidate of its max term (tighter bounds, fewer answers the accounting
    refuses); the other solvers relax it away."""

    node: str
    own: list[int]
    held: list[tuple[str, list[int]]]
    floor: int = 0
    recomputation: bool = False
    conversion_from: str | None = None
    pairs: list[tuple[str, str, list[list[int]]]] = field(default_factory=list)
    recomputed: list[tuple[str, list[int]]] = field(default_factory=list)
    recomputed_pairs: list[tuple[str, str, list[list[int]]]] = field(default_factory=list)
    apart: list[Apart] = field(default_factory=list)


@dataclass
class HeldSaved:
    """Bytes node `node` saves beyond its choices' saved bytes, alive all step (unless its block is checkpointed:
    then recomputed, which `HeldBeside` rows count), that the formulas leave out: nbytes[i][j] where `src` takes
    choice i and `node` choice j (a copy of an input the formulas count at an earlier node, kept where the
    input reaches `node` converted; `planner.search.held_saved.saved_copies`). The flat ILP counts them with its held
    rows."""

    src: str
    node: str
    nbytes: list[list[int]]


@dataclass
class HeldLess:
    """Bytes the formulas count in node `node`'s saved bytes under its choice i, nbytes[i], beyond the plan's: a
    storage the plan may count at an earlier node (saved twice: `planner.search.held_saved.saved_twice`), or negative, a
    view the plan counts as the larger storage it views (`planner.search.held_saved.saved_views`); the flat ILP with held
    rows takes them off (its memory row must not count more than the plan's). `where`: taken off only where every
    clause holds, a clause holding where one of its (node, per choice of it whether) takes a choice marked True (an
    earlier node saves that storage; the storage reaches `node` as it is made, not converted into a copy of its own);
    empty: whatever the choices. Bytes taken off under clauses are >= 0."""

    node: str
    nbytes: list[int]
    where: list[list[tuple[str, list[bool]]]] = field(default_factory=list)


@dataclass
class OptimizerStep:
    """What the optimizer step holds beside the model states, which the plan's bound counts as states + the larger
    of (activations + transient) and this (`Predicted.bound_bytes`): per node, bytes per choice (`nbytes`: its ops'
    `cost_models.optimizer.op_optimizer_bytes`), all of them at once (`summed`: foreach) or the largest
    (single-tensor), plus `fixed` (the caller's inputs, `optimizer_step_bytes`). The flat ILP with held rows counts
    it as a row of its own; the formulas count it beside the activations (the step problem, on the safe side)."""

    nbytes: list[tuple[str, list[int]]]
    summed: bool
    fixed: int = 0


@dataclass
class Problem:
    nodes: list[ProblemNode]
    edges: list[ProblemEdge]
    blocks: list[Block]
    budget_bytes: int
    checkpointing: bool = True
    # groups of labels (e.g. ("1d_col", "1d_row")) worth trying on every labelled node at once
    uniform_groups: list[tuple[str, ...]] = field(default_factory=list)
    shared_inputs: list[SharedInput] = field(default_factory=list)
    held_beside: list[HeldBeside] = field(default_factory=list)
    held_saved: list[HeldSaved] = field(default_factory=list)
    held_less: list[HeldLess] = field(default_factory=list)
    # blocks whose forward re-run `held_beside` counts (`planner.search.held_recompute`): with the held rows, the flat
    # ILP counts those rows there instead of the formulas' recompute rows, which can count more than the plan
    held_rerun: list[str] = field(default_factory=list)
    # the optimizer step beside the states (`OptimizerStep`): a row of the flat ILP with held rows
    held_step: OptimizerStep | None = None


GAP_TOLERANCE = 1e-4  # relative gap at which an answer counts as optimal
NOT_PROVEN = "not proven optimal: the priced search's lower bound stays below it"  # a "feasible" answer's note
# an "optimal" answer's note where its proof is of the solver's formulas, not of the plan's accounting
# (`Solution.plan_proven` false): the formulas count some assignments above the plan, so one the plan fits may be faster
FORMULAS_ONLY = ("proven optimal for the solver's memory formulas, not for the plan's accounting: they count some "
                 "assignments above it (saved tensors that share a storage, a checkpointed block's recomputation), "
                 "so a faster plan may fit")


@dataclass
class Solution:
    """status: "optimal" (proven: the gap to a lower bound closed), "feasible" (not proven: `gap` is the
    relative distance to the lower bound `bound`, NaN when none is known), "infeasible", "error", or
    "beaten" (stopped without an answer: its lower bound shows that an answer found elsewhere, another
    mesh's plan, is faster than anything it could find; `solve`'s `beaten`).

    `method` says how it was found ("flat", "priced", "two_level", "brute_force"); `message` explains an
    "error" status or an unproven figure in plain words (which limit stopped the solver; empty otherwise).
    """

    status: str
    choice: dict[str, int] = field(default_factory=dict)
    checkpointed: list[str] = field(default_factory=list)
    objective: float = float("nan")
    gap: float = 0.0
    seconds: float = 0.0
    solver: str = ""
    peak_bytes: int = 0
    min_feasible_budget: int | None = None
    method: str = ""
    message: str = ""
    bound: float = float("nan")  # a proven lower bound on the optimum (seconds); NaN when none is known
    # proven optimal for the plan's accounting, not only for the formulas (which count some assignments above it): no
    # plan that fits is faster. By the flat ILP counting the held rows (which count no more than the plan) at the
    # budget the plan is judged by, or a looser one (`refine._fixed`: over the options the formulas' reduced costs
    # keep, whose prices count the formulas' bytes, the one caveat left; `meshes._held_fitting`: over every option),
    # or as the fastest assignment whatever its memory (`meshes._fastest_of_all`). Where false, an "optimal" answer
    # is so for the formulas only (`FORMULAS_ONLY`)
    plan_proven: bool = False
    # proven optimal for the formulas, whatever the status says: "feasible" where the held rows' bound, which holds
    # for the plan, lies below it (`refine.HELD_BOUND`). The problem counting saved tensors apart restricts the
    # formulas' (it counts more), so it holds no faster answer (`meshes._counted_apart` does not solve it)
    formulas_proven: bool = False

    @classmethod
    def beaten_by_elsewhere(cls, bound: float, seconds: float, **fields: str) -> Solution:
        """Status "beaten": stopped without an answer once its lower bound `bound` showed that an answer
        found elsewhere is faster (`solve`'s `beaten`)."""
        return cls(status="beaten", seconds=seconds, bound=bound, **fields,
                   message=f"stopped: its lower bound {bound:.6g} s is beaten by an answer found elsewhere")

    def raise_bound(self, bound: float, tolerance: float) -> None:
        """Take a (possibly) higher proven lower bound: the gap shrinks, and the answer is "optimal" once
        the gap is within `tolerance` (the note that it is not proven goes). A bound above the answer's own time
        (beyond `tolerance`) is not one of its problem (the answer is a counterexample: a bound of the formulas
        where they count more than the accounting the answer fits) and is not taken."""
        if not (bound > self.bound or (math.isnan(self.bound) and math.isfinite(bound))) \
                or self.status not in ("optimal", "feasible") or bound > self.objective * (1 + tolerance):
            return
        self.bound = bound
        self.gap = relative_gap(self.objective, bound)
        if self.gap <= tolerance:
            self.status = "optimal"
            self.message = "; ".join(m for m in self.message.split("; ") if m and m != NOT_PROVEN)

    def widen_to(self, bound: float, tolerance: float, why: str) -> None:
        """Take `bound` where it is lower than the bound held (or none is held): the bound of a wider problem,
        whose optimum may lie below this answer's problem's (the problem counting tensors apart restricts the
        one counting them once), is what holds for the answer the user gets. Not proven optimal any more where
        the gap opens past `tolerance`; `why` says so in the message. Not where the answer is proven as the plan
        counts (`plan_proven`): no plan that fits is faster, whatever a wider problem's bound."""
        if (not math.isfinite(bound) or self.bound <= bound or self.status not in ("optimal", "feasible")
                or self.plan_proven):
            return
        self.bound = bound
        self.gap = relative_gap(self.objective, bound)
        if self.gap > tolerance:
            if self.status == "optimal":  # its note said what proved it, for its own problem
                self.status, self.message = "feasible", NOT_PROVEN
            self.message = "; ".join(m for m in (self.message, why) if m)


def relative_gap(objective: float, bound: float) -> float:
    """How far `objective` is above the lower bound `bound`, as a share of it (0 when not above it)."""
    return max(0.0, (objective - bound) / objective) if objective > 0 else 0.0
