"""From a planned op to the `layers3d` module that runs it on this rank's shards.

One builder per op kind, registered with `@builds(kind)`, reads the op (shapes, attrs, parameter names)
and its assignment (scheme, options, layouts) and returns the layer: `ParallelLinear` for linears (nn.Linear,
HF Conv1D, F.linear, aten.addmm), `ParallelEmbedding`, `ParallelLayerNorm`, and `ParallelCrossEntropy`
for the loss. Weights are sliced from the dense parameters, or initialised shard by shard when the dense
model lives on the meta device. A parameter shared by two ops (tied embedding and head) is owned by the
first op's layer; the second reads it through a redistribution to its own layout, so its gradient flows
back into the one tensor.

The small modules `GradReduce` and `OutputReduce` are the collectives that follow ops need: an input
broadcast over split dims gets its gradient all-reduced, a reduction over a split dim its result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from cost_models.layout import Layout
from cost_models.ops import OpNode
from cost_models.strategies.base import param_key
from layers3d.data_parallel import reduce_grad
from layers3d.embedding import ParallelEmbedding
from layers3d.functional import reduce_output
from layers3d.linear import ParallelLinear
from layers3d.linear_plan import LinearScheme
from layers3d.loss import vocab_parallel_cross_entropy
from layers3d.mesh import DeviceMesh
from layers3d.norm import ParallelLayerNorm
from layers3d.redistribute import redistribute
from layers3d.whole import GatheredParams, attr_name
from planner.apply_values import ApplyError
from planner.plan_format import Assignment

__all__ = ["LayerContext", "ParamHome", "build_layer", "builds", "GradReduce", "OutputReduce",
           "ParallelCrossEntropy", "TiedLayer", "linear_scheme", "stored_placement"]

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

    def param(self, op: OpNode, role: str) -> tuple[str, torch.Tensor] | None:
        for p in op.params:
            if p.role == role:
                try:
                    return p.name, self.params[p.name]
                except KeyError:
                    raise ApplyError(f"op {op.name} uses parameter {p.name!r}, which the model does not have; "
                                     "re-run `planner plan` for this model") from None
        return None


Builder = Callable[[OpNode, Assignment, LayerContext], nn.Module | None]
_BUILDERS: dict[str, Builder] = {}


def builds(*kinds: str) -> Callable[[Builder], Builder]:
    """Register a builder for op kinds."""
    def deco(fn: Builder) -> Builder:
        for k in kinds:
            _BUILDERS[k] = fn
        return fn
    return deco


def build_layer(op: OpNode, a: Assignment, ctx: LayerContext) -> tuple[str, nn.Module] | None:
    """The (module path, layer) for a planned op, or None when the op runs as traced."""
    fn = _BUILDERS.get(op.kind)
    if fn is None:
        return None
    layer = fn(op, a, ctx)
    if layer is None:
        return None
    return (op.module_path or op.name), layer


def _opt(a: Assignment, key: str, default: Any = None) -> Any:
    v = a.options.get(key, default)
    return tuple(v) if isinstance(v, list) else v


def _place(ctx: LayerContext, op: OpNode, layer: nn.Module, a: Assignment, attrs: dict[str, str]) -> nn.Module:
    """Record where each of `op`'s parameters lives; a parameter already placed by an earlier op (tied
    weights) is taken out of `layer` and fed from its home (see TiedLayer)."""
    ties: dict[str, ParamHome] = {}
    layouts: dict[str, Layout] = {}
    for p in op.params:
        attr = attrs.get(p.role)
        if attr is None or getattr(layer, attr, None) is None:
            continue
        home = stored_placement(layer, attr, tuple(p.shape))
        if p.name in ctx.homes:
            ties[attr], layouts[attr] = ctx.homes[p.name], home.layout
        else:
            ctx.homes[p.name] = home
    return TiedLayer(layer, ties, layouts, ctx.mesh) if ties else layer


def stored_placement(layer: nn.Module, attr: str, shape: tuple[int, ...]) -> ParamHome:
    """How a layers3d layer stores its parameter `attr` (of dense `shape`)."""
    if isinstance(layer, ParallelLinear):
        g = layer.geometry
        if attr == "bias":
            return ParamHome(layer, attr, (g.y_feat,), g.interleave if g.y_feat else 1, 0, shape)
        return ParamHome(layer, attr, tuple(layer.weight_dims), g.w_interleave, layer.weight_interleave_dim, shape)
    if isinstance(layer, ParallelEmbedding):
        return ParamHome(layer, attr, tuple(layer.weight_dims), 1, 0, shape)
    if isinstance(layer, ParallelLayerNorm):
        return ParamHome(layer, attr, (layer.features,), 1, 0, shape)
    raise AssertionError(f"no placement known for {type(layer).__name__}.{attr}")


# --- linear ----------------------------------------------------------------------------------------
def linear_scheme(a: Assignment) -> LinearScheme:
    """The layers3d scheme of a planned linear (options as `cost_models.strategies.linear` writes them)."""
    name = a.scheme
    roles: Axes = ()
    if name in ("1d_col", "1d_row"):
        roles = _opt(a, "T", ())
    elif name in ("2d", "3d", "3d_allreduce"):
        roles = _opt(a, "roles", ())
    # "shard": keep the input shard and all-gather it again in backward (1d_col with sp, 2d, 3d)
    return LinearScheme(name, tuple(roles), dp=_opt(a, "dp"), sp=bool(_opt(a, "sp", False)),
                        save_input=_opt(a, "save_input", "gathered"),
                        weight_shard=bool(_opt(a, "weight_shard", False)))


@builds("linear")
def _linear(op: OpNode, a: Assignment, ctx: LayerContext) -> nn.Module:
    w = ctx.param(op, "weight")
    b = ctx.param(op, "bias")
    if w is None:
        raise ApplyError(f"linear op {op.name} has no weight parameter")
    dense = SimpleNamespace(weight=w[1], bias=b[1] if b else None)
    layer = ParallelLinear.from_dense(dense, ctx.mesh, linear_scheme(a), interleave=int(_opt(a, "interleave", 1)),
                                      weight_transposed=bool(op.attrs.get("weight_transposed")),
                                      token_shape=op.input_meta[0].shape[:-1], generator=ctx.generator,
                                      device=ctx.device)
    return _place(ctx, op, layer, a, {"weight": "weight", "bias": "bias"})


# --- embedding -------------------------------------------------------------------------------------
_EMBEDDING_SCHEMES = {"replicate": "replicate", "fsdp": "fsdp", "vocab": "vocab", "1d_col": "hidden"}


@builds("embedding")
def _embedding(op: OpNode, a: Assignment, ctx: LayerContext) -> nn.Module:
    w = ctx.param(op, "weight")
    if w is None or a.scheme not in _EMBEDDING_SCHEMES:
        raise ApplyError(f"embedding op {op.name}: scheme {a.scheme!r} is not one the runtime implements")
    V, H = w[1].shape
    dense = SimpleNamespace(weight=w[1], num_embeddings=V, embedding_dim=H, padding_idx=op.attrs.get("padding_idx"))
    layer = ParallelEmbedding.from_dense(dense, ctx.mesh, _EMBEDDING_SCHEMES[a.scheme], axes=_opt(a, "T", ()),
                                         dp=_opt(a, "dp"), sp=bool(_opt(a, "sp", False)), generator=ctx.generator,
                                         device=ctx.device)
    return _place(ctx, op, layer, a, {"weight": "weight"})


# --- layer norm ------------------------------------------------------------------------------------
@builds("layer_norm")
def _layer_norm(op: OpNode, a: Assignment, ctx: LayerContext) -> nn.Module:
    lay = a.inputs[0]
    shape = tuple(op.attrs.get("normalized_shape", ()))
    if lay is None or len(shape) != 1:
        raise ApplyError(f"layer norm {op.name}: only a norm over the last dim with a planned input layout is "
                         f"supported (normalized_shape {shape})")
    w, b = ctx.param(op, "weight"), ctx.param(op, "bias")
    dense = SimpleNamespace(weight=w[1] if w else None, bias=b[1] if b else None, normalized_shape=shape,
                            eps=float(op.attrs.get("eps", 1e-5)))
    tokens = tuple(ax for d in lay.dims[:-1] for ax in d)
    layer = ParallelLayerNorm.from_dense(dense, ctx.mesh, features=lay.dims[-1], tokens=tokens,
                                         generator=ctx.generator, device=ctx.device)
    return _place(ctx, op, layer, a, {"weight": "weight", "bias": "bias"})


# --- opaque: ops run whole --------------------------------------------------------------------------
@builds("opaque", "conv")
def _opaque(op: OpNode, a: Assignment, ctx: LayerContext) -> nn.Module:
    """The parameters of an op run whole (`layers3d.whole`), stored as the plan says; the rewrite calls the
    op with the whole parameters they give."""
    dense: dict[str, torch.Tensor] = {}
    layouts: dict[str, Layout] = {}
    for k, p in enumerate(op.params):
        if p.name in ctx.homes:
            raise ApplyError(f"op {op.name} ({op.target}) shares parameter {p.name} with an earlier op; an op run "
                             "whole cannot share parameters: untie them, or give the op a layer the planner knows")
        found = ctx.params.get(p.name)
        if found is None:
            raise ApplyError(f"op {op.name} uses parameter {p.name!r}, which the model does not have; re-run "
                             "`planner plan` for this model")
        lay = a.params.get(param_key(op, k))
        if lay is None:
            raise ApplyError(f"op {op.name}: the plan has no layout for its parameter {p.name}; re-run `planner plan`")
        dense[p.name], layouts[p.name] = found, lay
    # the whole-op schemes gather; a conv's 1d_col computes on its output-channel block
    layer = GatheredParams(dense, layouts, _opt(a, "dp", ()), ctx.mesh, device=ctx.device,
                           used_as_stored=a.scheme == "1d_col")
    for name, lay in layouts.items():
        ctx.homes[name] = ParamHome(layer, attr_name(name), tuple(lay.dims), 1, 0, tuple(dense[name].shape))
    return layer


# --- loss ------------------------------------------------------------------------------------------
class ParallelCrossEntropy(nn.Module):
    """Mean cross-entropy of logits whose tokens and vocabulary may be split: layers3d's vocab-parallel
    loss, which all-reduces the loss sum and the token count over the token axes, so every rank holds the
    dense model's loss."""

    def __init__(self, mesh: DeviceMesh, vocab_axes: Axes, token_axes: Axes, ignore_index: int) -> None:
        super().__init__()
        self.mesh, self.vocab_axes, self.token_axes, self.ignore_index = mesh, vocab_axes, token_axes, ignore_index

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = vocab_parallel_cross_entropy(logits, target, self.mesh, vocab_axes=self.vocab_axes,
                                            token_axes=self.token_axes, ignore_index=self.ignore_index)
        return loss.to(logits.dtype)

    def extra_repr(self) -> str:
        return f"vocab={self.vocab_axes}, tokens={self.token_axes}, ignore_index={self.ignore_index}"


class _SumCrossEntropy(nn.Module):
    """Summed cross-entropy over token-split logits (vocabulary whole): local sum, then all-reduced."""

    def __init__(self, mesh: DeviceMesh, token_axes: Axes, ignore_index: int) -> None:
        super().__init__()
        self.mesh, self.token_axes, self.ignore_index = mesh, token_axes, ignore_index

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(logits, target, ignore_index=self.ignore_index, reduction="sum")
        return reduce_output(loss, self.token_axes, self.mesh)


@builds("cross_entropy")
def _cross_entropy(op: OpNode, a: Assignment, ctx: LayerContext) -> nn.Module | None:
    lay = a.inputs[0]
    reduction = op.attrs.get("reduction", "mean")
    vocab = tuple(lay.dims[-1]) if lay is not None else ()
    tokens = tuple(ax for d in lay.dims[:-1] for ax in d) if lay is not None else ()
    if op.attrs.get("fn", "cross_entropy") != "cross_entropy":
        if vocab or (tokens and reduction != "none"):
            raise ApplyError(f"{op.name}: a split nll_loss is not supported; plan it replicated")
        return None
    if not vocab and (not tokens or reduction == "none"):
        return None  # local: run as traced
    if reduction == "mean":
        return ParallelCrossEntropy(ctx.mesh, vocab, tokens, int(op.attrs.get("ignore_index", -100)))
    if reduction == "sum" and not vocab:
        return _SumCrossEntropy(ctx.mesh, tokens, int(op.attrs.get("ignore_index", -100)))
    raise ApplyError(f"{op.name}: cross-entropy with reduction={reduction!r} over a split vocabulary is not "
                     "supported; use reduction='mean'")


# --- tied parameters and follow-op collectives -------------------------------------------------------
class TiedLayer(nn.Module):
    """A layer whose parameters `ties` live in another layer (tied weights): before each call the home
    parameter is redistributed to this layer's layout (tag "tied") and set in place of its own, so the
    gradient of both uses accumulates in the home parameter."""

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
        return self.layer(*args)


class GradReduce(nn.Module):
    """Identity forward; all-reduces the gradient over `axes` (an input broadcast over split dims)."""

    def __init__(self, axes: Axes, mesh: DeviceMesh) -> None:
        super().__init__()
        self.axes, self.mesh = tuple(axes), mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.requires_grad:
            return x
        return reduce_grad(x, self.axes, self.mesh, "grad_input")

    def extra_repr(self) -> str:
        return f"axes={self.axes}"


class OutputReduce(nn.Module):
    """All-reduces a reduction's partial result over `axes` (tag output); `scale` divides it afterwards
    (a mean over a split dim is the mean of the local means)."""

    def __init__(self, axes: Axes, mesh: DeviceMesh, scale: float = 1.0) -> None:
        super().__init__()
        self.axes, self.mesh, self.scale = tuple(axes), mesh, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_output(x, self.axes, self.mesh)
        return y / self.scale if self.scale != 1.0 else y

    def extra_repr(self) -> str:
        return f"axes={self.axes}, scale={self.scale}"
