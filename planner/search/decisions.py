"""The plain data between the stages of `planner.search.build`: each op's strategies and costs (stage 1),
and the ops decided together (stage 2), which stage 3 prices (`planner.search.price_nodes`)."""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.strategy import OpCost, Strategy

__all__ = ["Decision", "Enumerated", "Grouped"]


@dataclass
class Decision:
    """A group of ops decided together: `members[k][c]` is the strategy index of member k under choice c."""

    name: str
    ops: list[str]
    members: list[list[int]]
    block: str | None


@dataclass
class Enumerated:
    """Stage 1, per op in execution order: the strategies offered (and why others are not), their costs,
    which ops copied both from the same op of the previous identical block, and the ops without a rule."""

    strategies: dict[str, list[Strategy]]
    not_offered: dict[str, list[str]]
    costs: dict[str, list[OpCost]]
    copied: dict[str, str]
    unsupported: list[str]


@dataclass
class Grouped:
    """Stage 2: ops decided together (a follower joins the decision of its only multi-choice producer)."""

    decisions: dict[str, Decision]
    decision_of: dict[str, str]
