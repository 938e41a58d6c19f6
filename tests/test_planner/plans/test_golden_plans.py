"""The planner's choices on a few built-in models equal the committed golden plans (tests/golden.py says how
to write them again when a change is meant to change them)."""

from __future__ import annotations

import json

import pytest
from golden import CASES, Case, changes, plan_case


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_plan_equals_golden(case: Case) -> None:
    assert case.path.exists(), f"no golden plan {case.path.name}: run `python tests/golden.py`"
    old = json.loads(case.path.read_text())
    new = plan_case(case)
    diff = changes(old, new)
    assert not diff and old == new, (
        f"{case.name}: the plan differs from tests/data/golden/{case.path.name}:\n  " + "\n  ".join(diff[:40])
        + "\nIf the change is intended, run `python tests/golden.py` and commit the new plans.")
