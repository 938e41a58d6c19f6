"""Checks of a plan against the model it is applied to, beyond the fingerprint.

A plan file is data a person may edit. The fingerprint says the model is the one the plan was made for;
`check_layouts` says the plan's own entries still fit that model: every planned op exists, and every
layout of its inputs, outputs and parameters has the tensor's number of dims and splits only dims that
divide over the mesh axes it names. A plan edited into another state is refused here, naming the entry,
before any layer is built or any collective runs (the check needs no process group).
"""

from __future__ import annotations

from collections.abc import Sequence

from cost_models.layout import Layout, LayoutError
from cost_models.mesh import Mesh
from cost_models.strategies.base import param_key
from planner.plans.format import Plan
from planner.plans.json_io import REPLAN, PlanError
from planner.trace.graph import ModelGraph

__all__ = ["check_layouts"]


def check_layouts(graph: ModelGraph, plan: Plan) -> None:
    """Raise PlanError naming the first assignment whose layouts do not fit the captured model's shapes."""
    ops = {op.name: op for op in graph.nodes}
    for i, a in enumerate(plan.assignments):
        where = f"assignments[{i}] ({a.node})"
        op = ops.get(a.node)
        if op is None:
            raise PlanError(f"{where}: the model has no op {a.node!r}; the plan was edited or made for another "
                            f"version of the model; {REPLAN}")
        _fit_all(f"{where}.inputs", a.inputs, [m.shape for m in op.input_meta], plan.mesh)
        if op.outputs and op.kind != "output":  # the graph's output op records one placeholder layout
            _fit_all(f"{where}.outputs", a.outputs, [m.shape for m in op.outputs], plan.mesh)
        # params are keyed as the cost model keys them: by role ("weight", "bias"; "weight1" when two share one)
        shapes = {param_key(op, k): p.shape for k, p in enumerate(op.params)}
        for name, layout in a.params.items():
            if name not in shapes:
                raise PlanError(f"{where}.params: the op has no parameter {name!r} (it has "
                                f"{', '.join(sorted(shapes)) or 'none'}); {REPLAN}")
            _fit(f"{where}.params[{name}]", layout, shapes[name], plan.mesh)


def _fit_all(path: str, layouts: Sequence[Layout | None], shapes: Sequence[tuple[int, ...]], mesh: Mesh) -> None:
    if len(layouts) != len(shapes):
        raise PlanError(f"{path}: {len(layouts)} layouts for {len(shapes)} tensors; {REPLAN}")
    for k, (layout, shape) in enumerate(zip(layouts, shapes)):
        if layout is not None:
            _fit(f"{path}[{k}]", layout, shape, mesh)


def _fit(path: str, layout: Layout, shape: tuple[int, ...], mesh: Mesh) -> None:
    try:
        layout.local_shape(shape, mesh)
    except LayoutError as e:
        raise PlanError(f"{path}: {e}; the plan does not fit the model's shapes (was it edited?); {REPLAN}") from None
