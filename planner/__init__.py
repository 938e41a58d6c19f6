"""planner: a memory-budgeted auto-parallelization planner for PyTorch.

    from planner import plan, apply_plan, distributed, gather_state_dict, Plan
    p = plan(model, budget="16GiB", world_size=8, example_inputs=(ids, targets))
    p.save("plan.json")
    with distributed(timeout_s=300):                             # on every rank, under torchrun
        parallel_model = apply_plan(model, Plan.load("plan.json"))

Names are imported on first use, so `import planner` stays cheap and each part can be used alone. No
exported name is also the name of a submodule (the capture stage is the package `planner.trace`): importing a
submodule sets it as an attribute of the package, which would shadow an exported function of that name.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "plan": "planner.api",
    "InfeasibleError": "planner.api",
    "WorldSizeError": "planner.api",
    "Plan": "planner.plans.format",
    "PlanError": "planner.plans.format",
    "apply_plan": "planner.apply.rewrite",
    "distributed": "planner.verify.guard",
    "gather_state_dict": "planner.apply.state",
    "capture": "planner.trace.tracer",
    "CaptureError": "planner.trace.tracer",
    "PlannerError": "cost_models.errors",
    "ModelGraph": "planner.trace.graph",
    "BlockInfo": "planner.trace.graph",
    "BudgetError": "planner.units",
    "parse_bytes": "planner.units",
    "format_bytes": "planner.units",
    "optimizer_kwargs": "cost_models.optimizer",
    "Example": "planner.models",
    "EXAMPLES": "planner.models",
    "get_example": "planner.models",
    "load_model": "planner.models",
    "ModelLoadError": "planner.models",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
