"""Layers that run a module (or a function reading parameters) whole on every rank.

For ops no parallel layer exists for. `dp` are the axes over which the op's input is split into blocks
of the batch: each rank's gradient of a whole parameter is its block's share. Each parameter is stored as
this rank's block of a `Layout`: replicated (its gradient all-reduced over `dp`), or split on one dim
over `dp` then the other axes (FSDP): gathered over the other axes (`layers3d.redistribute`; gradient
sliced back) and over `dp` (`gather_param`; gradient reduce-scattered, summing the blocks' shares).

    params = GatheredParams({"weight": w}, {"weight": Layout(((), ("x",)))}, dp=("y",), mesh=mesh)
    full = params()                                   # [whole weight], differentiable
    layer = WholeModule(conv, params)                 # conv run with the whole parameters
    y = layer(x_block)

`WholeModule` keeps the module's buffers (running statistics) in the module itself, updated in place as in
the dense model.

The builder (`build_whole`, for the families whose rules price their ops run whole: `opaque` and `conv`)
makes the store from the plan's parameter layouts; the FX rewrite (`planner.apply.graph`) calls the op
with what it gives. A conv planned `1d_col` computes on its block of output channels (`used_as_stored`)
and its input's gradient is all-reduced over T (`input_grad_axes`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from cost_models.layout import Layout
from layers3d.builders import LayerRequest, StoredPlacement, builds
from layers3d.data_parallel import gather_param, reduce_grad
from layers3d.errors import LayerBuildError, ShardingError
from layers3d.mesh import DeviceMesh
from layers3d.redistribute import redistribute
from layers3d.shard import shard_tensor

__all__ = ["GatheredParams", "WholeModule", "attr_name", "build_whole"]

Axes = tuple[str, ...]


def attr_name(name: str) -> str:
    """A parameter's attribute on `GatheredParams` (dots are not allowed in parameter names)."""
    return name.replace(".", "__")


class GatheredParams(nn.Module):
    """This rank's blocks of some parameters; calling it gives the whole parameters (see the module
    docstring), or with `used_as_stored` the blocks themselves (the op computes on its block: a conv's
    output channels split), their gradients all-reduced over `dp`. `names` keeps their order;
    `layouts[name]` is how each is stored; `input_grad_axes`: the axes the op's input gradient is
    all-reduced over (the caller inserts the reduction)."""

    def __init__(self, dense: Mapping[str, torch.Tensor], layouts: Mapping[str, Layout], dp: Sequence[str],
                 mesh: DeviceMesh, device: torch.device | str | None = None, used_as_stored: bool = False,
                 input_grad_axes: Sequence[str] = ()) -> None:
        super().__init__()
        self.mesh, self.dp, self.used_as_stored = mesh, tuple(dp), used_as_stored
        self.input_grad_axes = tuple(input_grad_axes)
        self.names = list(dense)
        self.layouts = {n: layouts[n] for n in self.names}
        self.shapes = {n: tuple(dense[n].shape) for n in self.names}
        for n, t in dense.items():
            local = shard_tensor(t.detach(), self.layouts[n], mesh.mesh, mesh.rank)
            if device is not None:
                local = local.to(device)
            self.register_parameter(attr_name(n), nn.Parameter(local, requires_grad=t.requires_grad))

    def local(self, name: str) -> torch.Tensor:
        return getattr(self, attr_name(name))

    def param_attr(self, name: str) -> str:
        """The attribute holding the block of the model's parameter `name`."""
        return attr_name(name)

    def stored_placement(self, attr: str) -> StoredPlacement:
        """Each parameter is stored as its layout says (no interleaved segments)."""
        name = next(n for n in self.names if attr_name(n) == attr)
        return StoredPlacement(tuple(self.layouts[name].dims))

    def forward(self) -> list[torch.Tensor]:
        return [self._whole(n) for n in self.names]

    def _whole(self, name: str) -> torch.Tensor:
        p, lay = self.local(name), self.layouts[name]
        split = [d for d, axes in enumerate(lay.dims) if axes]
        if not split or self.used_as_stored:  # whole, or used as stored (a conv's output channels split)
            return reduce_grad(p, self.dp, self.mesh)
        # stored split over (dp..., rest...) on dim d: gather the rest (its gradient: a slice, complete
        # over rest), then the dp blocks (its gradient: reduce-scattered, summing the batch blocks' shares)
        d = split[0]
        axes = lay.dims[d]
        dp = axes[:len(self.dp)]
        if len(split) > 1 or dp != self.dp:
            raise ShardingError(f"parameter {name} stored as {lay}: expected one dim split over the batch axes "
                                f"{self.dp} first")
        if len(axes) > len(dp):
            p = redistribute(p, lay, Layout.shard(len(lay.dims), d, dp), self.mesh, self.shapes[name], tag="weight")
        return gather_param(p, d, dp, self.mesh)

    def extra_repr(self) -> str:
        return f"dp={self.dp}, " + ", ".join(f"{n}: {self.layouts[n]}" for n in self.names)


class WholeModule(nn.Module):
    """`module` called with the whole parameters `params` gives (a copy of the module without its own
    parameters is kept, with its buffers; they move to `device` when given)."""

    def __init__(self, module: nn.Module, params: GatheredParams, device: torch.device | str | None = None,
                 prefix: str = "") -> None:
        super().__init__()
        self.params = params
        own = {n for n, _ in module.named_parameters()}
        # the store names parameters as the model does ("lstm.weight_ih_l0"); the module by its own names
        self.inner = [n[len(prefix):] if prefix and n.startswith(prefix) else n for n in params.names]
        missing = [n for n in self.inner if n not in own]
        if missing:
            raise ShardingError(f"{type(module).__name__} has no parameters {missing} (it has {sorted(own)})")
        shell = copy.deepcopy(_without_params(module))
        self.module = shell.to(device) if device is not None else shell

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        full = dict(zip(self.inner, self.params()))
        return torch.func.functional_call(self.module, full, args, kwargs, strict=False)


def _without_params(module: nn.Module) -> nn.Module:
    """A shallow stand-in of `module` without parameters (so that deep-copying it does not copy the dense
    weights, and the parallel model holds only its blocks); `functional_call` supplies them by name. Its
    buffers are kept."""
    clone = copy.copy(module)
    clone._parameters = {k: None for k, v in module._parameters.items() if v is None}  # Conv2d(bias=False)
    clone._modules = {k: (None if v is None else _without_params(v)) for k, v in module._modules.items()}
    return clone


@builds("opaque", "conv")
def build_whole(req: LayerRequest) -> GatheredParams:
    """The parameters of an op run whole, stored as the plan says (see the module docstring)."""
    op = req.op
    dense: dict[str, torch.Tensor] = {}
    layouts: dict[str, Layout] = {}
    for p in op.params:
        lay = req.param_layouts.get(p.name)
        if lay is None:
            raise LayerBuildError(f"op {op.name}: the plan has no layout for its parameter {p.name}; re-run "
                                  "`planner plan`")
        dense[p.name], layouts[p.name] = req.named[p.name], lay
    channels = req.scheme == "1d_col"  # a conv computing on its block of output channels
    return GatheredParams(dense, layouts, req.option("dp", ()), req.mesh, device=req.device,
                          used_as_stored=channels, input_grad_axes=req.option("T", ()) if channels else ())
