"""The runtime half of an op family: a builder per op kind that makes this rank's parallel layer.

An op family whose ops need a parallel layer (linear, embedding, layer norm, the vocab-parallel loss)
registers its builder beside the layer, in `layers3d/<family>.py`:

    @builds("layer_norm")
    def build_layer_norm(req: LayerRequest) -> nn.Module | None: ...

The builder gets plain data (`LayerRequest`: the op, its planned scheme, options and layouts, the dense
parameters by role, the mesh, the device and the init generator), never a plan, so layers3d stays free
of the planner. It returns the layer, or None when the op runs as traced (a local loss). A layer that
holds parameters says how it stores each one with a method `stored_placement(attr) -> StoredPlacement`,
which is what gathering a dense state dict and feeding a tied parameter read.

Every module of this package is imported before the first lookup, so a new layer file needs no
import line anywhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cost_models.layout import Layout
from cost_models.ops import OpNode
from layers3d.errors import LayerBuildError
from layers3d.mesh import DeviceMesh

__all__ = ["LayerRequest", "StoredPlacement", "Builder", "builds", "builder", "LayerBuildError"]

Axes = tuple[str, ...]


@dataclass(frozen=True)
class StoredPlacement:
    """How a layer stores one parameter: the axes splitting each stored dim, and `interleave` segments of
    dim `interleave_dim` each split on its own (a fused q/k/v weight)."""

    dims: tuple[Axes, ...]
    interleave: int = 1
    interleave_dim: int = 0


@dataclass(frozen=True)
class LayerRequest:
    """What a builder reads (see the module docstring). `params` maps a role ("weight", "bias") to the
    dense tensor (on the meta device when the model is); `inputs`/`outputs` are the planned layouts.
    For an op holding several parameters of one role (an LSTM run whole), `named` and `param_layouts`
    map each parameter's model name to its dense tensor and to its planned storage layout."""

    op: OpNode
    scheme: str
    options: Mapping[str, Any]
    inputs: tuple[Layout | None, ...]
    outputs: tuple[Layout, ...]
    params: Mapping[str, torch.Tensor]
    mesh: DeviceMesh
    device: torch.device
    generator: torch.Generator | None = None
    named: Mapping[str, torch.Tensor] = field(default_factory=dict)
    param_layouts: Mapping[str, Layout] = field(default_factory=dict)

    def option(self, key: str, default: Any = None) -> Any:
        """Option `key` (lists, as JSON gives them back, as tuples)."""
        v = self.options.get(key, default)
        return tuple(v) if isinstance(v, list) else v

    def param(self, role: str) -> torch.Tensor | None:
        return self.params.get(role)


Builder = Callable[[LayerRequest], "nn.Module | None"]
_BUILDERS: dict[str, Builder] = {}
_loaded = False


def builds(*kinds: str) -> Callable[[Builder], Builder]:
    """Decorator: `fn` builds the layers of ops of these kinds."""
    def deco(fn: Builder) -> Builder:
        for k in kinds:
            if k in _BUILDERS:
                raise LayerBuildError(f"op kind {k!r} already has a layer builder ({_BUILDERS[k].__name__})")
            _BUILDERS[k] = fn
        return fn
    return deco


def builder(kind: str) -> Builder | None:
    """The builder registered for `kind`, or None when ops of that kind run as traced."""
    global _loaded
    if not _loaded:
        import layers3d

        for m in pkgutil.iter_modules(layers3d.__path__):
            importlib.import_module(f"layers3d.{m.name}")
        _loaded = True
    return _BUILDERS.get(kind)
