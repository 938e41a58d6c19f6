"""Golden plans: what the planner chooses for a few built-in models, kept as plan files in tests/data/golden.

`tests/test_planner/plans/test_golden_plans.py` plans each case again and fails on any difference (apart from the solver's
seconds), so a change in what the planner chooses is seen in review. When a change is meant to change the
plans, write them again and commit the diff with the change:

    python tests/golden.py            # rewrite tests/data/golden/*.json
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    budget: str
    world_size: int
    hardware: str = "cpu-gloo"

    @property
    def path(self) -> Path:
        return GOLDEN / f"{self.name}.json"


# Budgets where every solve is proven optimal quickly (the plan cannot depend on how busy the machine is).
CASES = (
    Case("gpt-tiny-8-1GiB", "gpt-tiny", "1GiB", 8),
    Case("mlp-8-1GiB", "mlp", "1GiB", 8),
    Case("hf-gpt2-8-1GiB", "hf-gpt2", "1GiB", 8),
)


def plan_case(case: Case) -> dict[str, Any]:
    """The case's plan as JSON data, without the solver's seconds (the one field that varies by run)."""
    from planner import get_example, plan

    ex = get_example(case.model)
    p = plan(ex.model, case.budget, world_size=case.world_size, example_inputs=ex.example_inputs,
             hardware=case.hardware)
    return comparable(json.loads(p.to_json()))


def comparable(data: dict[str, Any]) -> dict[str, Any]:
    data = json.loads(json.dumps(data))
    data.get("solver", {}).pop("seconds", None)
    return data


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Readable differences: per op the scheme and layouts first, then any other field."""
    out: list[str] = []
    olds = {a["node"]: a for a in old.get("assignments", [])}
    news = {a["node"]: a for a in new.get("assignments", [])}
    for node in sorted(set(olds) | set(news)):
        a, b = olds.get(node), news.get(node)
        if a is None or b is None:
            out.append(f"op {node}: {'added' if a is None else 'removed'}")
        elif a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"op {node}: {a.get('scheme')} -> {b.get('scheme')} (changed: {', '.join(keys)})")
    for key in sorted(set(old) | set(new)):
        if key != "assignments" and old.get(key) != new.get(key):
            out.append(f"{key}: changed")
    return out


def main() -> int:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        data = plan_case(case)
        tmp = case.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        tmp.replace(case.path)
        print(f"wrote {case.path.relative_to(Path.cwd()) if case.path.is_relative_to(Path.cwd()) else case.path}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
