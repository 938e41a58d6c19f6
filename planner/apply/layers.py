"""From a planned op to the `layers3d` module that runs it on this rank's shards: the generic dispatch.

The builders live with their layers in layers3d, one per op kind (`layers3d.builders`); this module
hands a builder plain data (`LayerRequest`: the op, the assignment's scheme, options and layouts, the
dense parameters by role, the mesh, device and init generator) and records where the layer stores each
parameter, as the layer itself says (`stored_placement`). Weights are sliced from the dense parameters, or
initialised shard by shard when the dense model lives on the meta device. A parameter shared by two ops
(tied embedding and head) is owned by the first op's layer; the second reads it through a
redistribution to its own layout, so its gradient flows back into the one tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from cost_models.layout import Layout
from cost_models.ops import OpNode
from cost_models.strategies.base import param_key
from layers3d.builders import LayerBuildError, LayerRequest, builder
from layers3d.mesh import DeviceMesh
from layers3d.redistribute import redistribute
from planner.apply.values import ApplyError
from planner.plans.format import Assignment

__all__ = ["LayerContext", "ParamHome", "build_layer", "TiedLayer", "stored_placement", "layer_path"]

Axes = tuple[str, ...]


@dataclass
class ParamHome:
    """Where a dense parameter lives in the parallel model: the layer and attribute holding its block,
    the axes splitting each stored dim, the interleaved segments of dim `interleave_dim`, the dense shape."""

    layer: nn.Module
    attr: str
    dims: tuple[Axes, ...]
    interleave: int
    interleave_dim: int
    shape: tuple[int, ...]

    @property
    def layout(self) -> Layout:
        """The placement as a Layout (interleave is expressible on the last dim only)."""
        if self.interleave > 1 and self.interleave_dim % len(self.dims) != len(self.dims) - 1:
            raise ApplyError(f"parameter {self.attr} of {type(self.layer).__name__} is interleaved on dim "
                             f"{self.interleave_dim}, which a Layout cannot describe (it cannot be tied to another op)")
        return Layout(self.dims, interleave=self.interleave)

    @property
    def local(self) -> torch.Tensor:
        return getattr(self.layer, self.attr)


@dataclass
class LayerContext:
    """What the builders share: the mesh, the dense parameters by name, the run device, and the homes of
    the parameters already placed (for tied weights)."""

    mesh: DeviceMesh
    params: dict[str, torch.Tensor]
    device: torch.device
    homes: dict[str, ParamHome] = field(default_factory=dict)
    generator: torch.Generator | None = None

    def params_by_role(self, op: OpNode) -> dict[str, torch.Tensor]:
        """The dense parameters `op` uses, by role (the first of each role)."""
        out: dict[str, torch.Tensor] = {}
        for p in op.params:
            if p.role in out:
                continue
            try:
                out[p.role] = self.params[p.name]
            except KeyError:
                raise ApplyError(f"op {op.name} uses parameter {p.name!r}, which the model does not have; "
                                 "re-run `planner plan` for this model") from None
        return out

    def params_by_name(self, op: OpNode) -> dict[str, torch.Tensor]:
        """Every dense parameter `op` uses, by its model name."""
        missing = [p.name for p in op.params if p.name not in self.params]
        if missing:
            raise ApplyError(f"op {op.name} uses parameter {missing[0]!r}, which the model does not have; "
                             "re-run `planner plan` for this model")
        return {p.name: self.params[p.name] for p in op.params}


def build_layer(op: OpNode, a: Assignment, ctx: LayerContext) -> tuple[str, nn.Module] | None:
    """The (module path, layer) for a planned op, or None when the op runs as traced."""
    fn = builder(op.kind)
    if fn is None:
        return None
    req = LayerRequest(op=op, scheme=a.scheme, options=a.options, inputs=tuple(a.inputs), outputs=tuple(a.outputs),
                       params=ctx.params_by_role(op), mesh=ctx.mesh, device=ctx.device, generator=ctx.generator,
                       named=ctx.params_by_name(op), param_layouts=_param_layouts(op, a))
    try:
        layer = fn(req)
    except LayerBuildError as e:
        raise ApplyError(str(e)) from e
    if layer is None:
        return None
    return layer_path(op), _place(ctx, op, layer)


def _param_layouts(op: OpNode, a: Assignment) -> dict[str, Layout]:
    """The plan's storage layout of each of `op`'s parameters, by model name (the plan keys them as the cost
    model does: by role, or role + index when roles repeat)."""
    out = {}
    for k, p in enumerate(op.params):
        lay = a.params.get(param_key(op, k))
        if lay is not None:
            out[p.name] = lay
    return out


def layer_path(op: OpNode) -> str:
    """Where `op`'s layer sits in the parallel module. An op with parameters is a module of its own (a
    linear, an embedding, a norm): its layer takes that module's path, so the parallel model's keys are the
    dense ones. An op without parameters (the loss) is a call inside some module's forward, whose path is
    that module's: a HF model computing its own loss inside a wrapper gives the path of the whole HF model
    ("m"), and a layer put there would replace it, with every layer under it. So it gets a path of its
    own under that module ("m.cross_entropy_loss")."""
    if op.params:
        return op.module_path or op.name
    return f"{op.module_path}.{op.name}" if op.module_path else op.name


def _place(ctx: LayerContext, op: OpNode, layer: nn.Module) -> nn.Module:
    """Record where each of `op`'s parameters lives (the layer holds it under its role's name, or the name
    its `param_attr(model name)` method gives); a
    parameter already placed by an earlier op (tied weights) is taken out of `layer` and fed from its
    home (see TiedLayer)."""
    ties: dict[str, ParamHome] = {}
    layouts: dict[str, Layout] = {}
    attr_of = getattr(layer, "param_attr", None)  # a layer holding parameters under other names than roles
    for p in op.params:
        attr = attr_of(p.name) if attr_of is not None else p.role
        if getattr(layer, attr, None) is None:
            continue
        home = stored_placement(layer, attr, tuple(p.shape))
        if p.name in ctx.homes:
            ties[attr], layouts[attr] = ctx.homes[p.name], home.layout
        else:
            ctx.homes[p.name] = home
    return TiedLayer(layer, ties, layouts, ctx.mesh) if ties else layer


def stored_placement(layer: nn.Module, attr: str, shape: tuple[int, ...]) -> ParamHome:
    """Where `layer` stores its parameter `attr` (of dense `shape`), as the layer's own
    `stored_placement` method says."""
    method = getattr(layer, "stored_placement", None)
    if method is None:
        raise AssertionError(f"{type(layer).__name__} holds parameter {attr} but has no stored_placement method")
    placed = method(attr)
    return ParamHome(layer, attr, tuple(placed.dims), placed.interleave, placed.interleave_dim, shape)


# --- tied parameters ---------------------------------------------------------------------------------
class TiedLayer(nn.Module):
    """A layer whose parameters `ties` live in another layer (tied weights): before each call the home
    parameter is redistributed to this layer's layout (tag "tied") and set in place of its own, so the
    gradient of both uses accumulates in the home parameter. The copy is taken off the layer after the
    call: it lives on only where autograd saved it, as the plan counts it (a saved activation, freed by the
    backward), not through the optimizer step (HF BERT's tied decoder at batch 1 x 8 on 8 ranks: a
    131,072 B copy kept on the layer measured 6.9 % above the predicted peak, in the optimizer step)."""

    def __init__(self, layer: nn.Module, ties: dict[str, ParamHome], layouts: dict[str, Layout],
                 mesh: DeviceMesh) -> None:
        super().__init__()
        self.layer, self.mesh = layer, mesh
        self._ties = ties  # plain attribute: the homes are registered elsewhere
        self._layouts = layouts
        for attr in ties:
            del layer._parameters[attr]

    def forward(self, *args: Any) -> Any:
        for attr, home in self._ties.items():
            src = getattr(home.layer, home.attr)
            setattr(self.layer, attr, redistribute(src, home.layout, self._layouts[attr], self.mesh, home.shape,
                                                   tag="tied"))
        try:
            return self.layer(*args)
        finally:
            for attr in self._ties:
                delattr(self.layer, attr)
