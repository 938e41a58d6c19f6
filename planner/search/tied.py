"""A tied weight's copy: one definition for the solver's problem and the plan's accounting.

A linear whose weight an earlier op owns (a language model's head tied to its token embedding) runs on a
copy of that parameter in its own layout whenever its layout of the weight differs from the owner's
(`planner.apply.layers.TiedLayer` converts the owner's parameter), and saves the copy for its input
gradient: it is no parameter. A linear that gathers its weight in forward and keeps it for backward saves
the gathered weight, which its own rule prices, so it holds no copy; one that gathers it again in backward
(fsdp, 3d_allreduce with weight_shard) saves its stored shard, which is the copy (measured by `planner
verify` on HF GPT-2, 2x2x2, head under 3d_allreduce with weight_shard: 16,384 B saved beyond the rule). The copy depends on both ops' strategies. The plan adds
it to the user's saved activations (alive from the user's forward to its backward), and the problem
carries the same bytes as saved bytes on an edge from the owner's decision to the user's
(`ProblemEdge.saved_bytes`): the solver counts what the plan's bound, which the budget is checked
against, counts. (It once carried them as a working set beside the user's own, which is when the plan's
timeline holds them; every answer with a copy then came back over the budget by the bound and was
solved again under a tighter one.) Measured: 16,384 B on a 1d HF GPT-2 tiny rank (the head's vocab-split
(32, 128) copy of the hidden-split embedding).
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.mesh import Mesh
from cost_models.ops import DTYPE_BYTES, OpNode, ParamInfo
from cost_models.strategies.base import param_key
from cost_models.strategy import OpCost, Strategy
from planner.trace.graph import ModelGraph

__all__ = ["TiedUse", "tied_uses", "copy_bytes"]


@dataclass(frozen=True)
class TiedUse:
    """A linear (`user`) whose weight `param` is stored by the earlier op `home` (its params[index])."""

    home: str
    user: str
    index: int
    param: ParamInfo


def tied_uses(graph: ModelGraph) -> list[TiedUse]:
    """Every linear whose weight an earlier op owns (the first op that uses a parameter stores it)."""
    owner_of: dict[str, str] = {}
    for op in graph.nodes:
        for p in op.params:
            owner_of.setdefault(p.name, op.name)
    out = []
    for op in graph.nodes:
        w = next((p for p in op.params if p.role == "weight"), None)
        if op.kind != "linear" or w is None or owner_of[w.name] == op.name:
            continue
        home = graph.node(owner_of[w.name])
        out.append(TiedUse(home.name, op.name, next(i for i, p in enumerate(home.params) if p.name == w.name), w))
    return out


def copy_bytes(use: TiedUse, home: OpNode, home_strategy: Strategy, user_strategy: Strategy, user_cost: OpCost,
               mesh: Mesh) -> int:
    """Bytes of the user's copy of the weight under these strategies (0 when it holds none)."""
    gathers = {c.phase for c in user_cost.collectives if c.tag == "weight"}
    if "forward" in gathers and "backward" not in gathers:  # keeps the gathered weight, not the copy
        return 0
    home_lay = dict(home_strategy.params).get(param_key(home, use.index))
    lay = dict(user_strategy.params).get("weight")
    if lay is None or home_lay is None or lay == home_lay:
        return 0
    return lay.local_numel(use.param.shape, mesh) * DTYPE_BYTES[use.param.dtype]
