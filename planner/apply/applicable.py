"""Before a plan leaves the planner: can `apply_plan` build it? Checked with the same code, on meta tensors.

`check_applicable(model, graph, plan)` runs what `apply_plan` runs on a rank, except the collectives:
the layout checks (`planner.plans.check`), then the per-rank rewrite (`planner.apply.graph`) with every
layer built by `planner.apply.layers.build_layer` from meta copies of the parameters, on a `DeviceMesh`
without process groups, for rank 0 and the last rank (a rank's coordinates change only which block it
holds, not whether the shapes divide). A plan whose assignment the runtime refuses (a scheme a layer does
not implement, a parameter layout it cannot store, a graph pattern the rewrite does not support) is
refused here, naming the op, instead of on every rank after launch.
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from cost_models.errors import PlannerError
from cost_models.layout import Layout, LayoutError
from cost_models.ops import OpNode
from layers3d.errors import LayerBuildError, ShardingError
from layers3d.mesh import DeviceMesh
from planner.apply.blocks import extract_blocks
from planner.apply.graph import rewrite_graph
from planner.apply.layers import LayerContext, build_layer
from planner.apply.values import ApplyError, node_values
from planner.plans.check import check_layouts
from planner.plans.format import Plan
from planner.plans.json_io import PlanError
from planner.trace.graph import ModelGraph

__all__ = ["check_applicable", "NotApplicableError"]

_META = torch.device("meta")


class NotApplicableError(PlannerError, ValueError):
    """A plan `apply_plan` would refuse: names the op and why."""


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=_META)


def check_applicable(model: nn.Module, graph: ModelGraph, plan: Plan) -> None:
    """Raise NotApplicableError when `apply_plan(model, plan)` would fail to build this rank's model (see
    the module docstring). `graph` is the model as captured for planning."""
    try:
        check_layouts(graph, plan)
    except PlanError as e:
        raise NotApplicableError(f"the plan for {graph.name} does not fit the model: {e}") from e
    nv = node_values(graph, model)
    assignments = {a.node: a for a in plan.assignments}
    for rank in sorted({0, plan.mesh.world_size - 1}):
        mesh = DeviceMesh.detached(plan.mesh, rank)
        params = {n: _meta_like(p) for n, p in model.named_parameters()}
        ctx = LayerContext(mesh, params, _META)
        current: list[str] = []

        def make(op: OpNode, a, ctx: LayerContext = ctx, current: list[str] = current):
            current[:] = [f"op {op.name} ({op.target}, {a.strategy})"]
            layer = build_layer(op, a, ctx)
            current.clear()
            return layer

        def whole(op: OpNode, k: int = 0) -> Layout:
            return Layout.replicated(len(op.input_meta[k].shape if op.kind == "output" else op.out.shape))

        def tensor_of(op: OpNode, node: fx.Node) -> torch.Tensor:
            return torch.empty(op.out.shape, dtype=getattr(torch, op.out.dtype), device=_META)

        try:
            result = rewrite_graph(graph, nv, assignments, mesh, make, arriving=whole, leaving=whole,
                                   checkpointed=set(plan.checkpoint), device=_META, tensor_of=tensor_of)
            extract_blocks(result.graph, lambda b: f"checkpoint_{b.replace('.', '_')}")
        except (ApplyError, LayerBuildError, ShardingError, LayoutError, PlanError, ValueError, KeyError, AssertionError) as e:
            where = current[0] if current else "the rewrite"
            raise NotApplicableError(
                f"the plan for {graph.name} cannot be applied (rank {rank}): {where}: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}; plan with other schemes (schemes=...) or give the "
                "op a layer the runtime implements") from e
