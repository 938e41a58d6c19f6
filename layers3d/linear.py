"""ParallelLinear: y = x W^T + b for every scheme of docs/ARCHITECTURE.md, on local shards.

The scheme is a value defined in `cost_models.linear_scheme`: `linear_plan` gives its layouts (x as it
arrives and as the matmul uses it, W as stored and as used, y as it leaves) from the same enumeration the
cost model prices, and `linear_steps` the redistribution steps between them. This module only executes
those steps around a local matmul (`layers3d.redistribute.run_step`, as edges do), so what runs is what
was priced; there is no per-scheme branch here. The weight/bias gradient reductions over the
data-parallel axes are among the steps, so gradients are complete when backward returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import TypeVar

import torch
from torch import nn
from torch.nn import functional as F

from cost_models.layout import Layout, LayoutError
from cost_models.linear_scheme import (
    LinearPlan,
    LinearScheme,
    LinearSchemeError,
    LinearSteps,
    linear_plan,
    linear_steps,
)
from cost_models.redistribution import Step
from layers3d.builders import LayerRequest, StoredPlacement, builds
from layers3d.errors import LayerBuildError, ShardingError
from layers3d.mesh import DeviceMesh
from layers3d.redistribute import run_step
from layers3d.shard import ParamInit, gather_tensor, init_shard, local_block

__all__ = ["ParallelLinear", "build_linear"]

Axes = tuple[str, ...]
_T = TypeVar("_T")


@dataclass(frozen=True)
class _Call:
    """The steps of one plan resolved for one input shape (what the autograd function needs)."""

    mesh: DeviceMesh
    steps: LinearSteps
    save_shard: bool       # save x as it arrived (gather it again in backward)
    regather: bool         # gather W again in backward instead of saving the gathered W
    transposed: bool       # W stored [K, N] (HF Conv1D); the steps are in [N, K] orientation


def _run(t: torch.Tensor, steps: Sequence[Step], mesh: DeviceMesh, tag: str) -> torch.Tensor:
    for s in steps:
        t = run_step(t, s, mesh, tag)
    return t


def _run_stored(w: torch.Tensor, steps: Sequence[Step], call: _Call, tag: str) -> torch.Tensor:
    """Run [N, K]-oriented steps on a weight (or weight gradient) in its stored orientation."""
    if call.transposed:
        steps = [replace(s, dim=None if s.dim is None else 1 - s.dim) for s in steps]
    return _run(w, steps, call.mesh, tag)


def _nk(w: torch.Tensor, transposed: bool) -> torch.Tensor:
    return w.t() if transposed else w  # (N_loc, K_loc) view of W as stored


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, call: _Call) -> torch.Tensor:
        st, m = call.steps, call.mesh
        xg = _run(x, st.x_fwd, m, "input")
        wg = _run_stored(w, st.w_fwd, call, "weight")
        y = F.linear(xg, _nk(wg, call.transposed))    # y_eff: partial over the axes splitting K
        y = _run(y, st.y_fwd, m, "output")              # y_out, complete
        y = y + b if b is not None else y
        ctx.call, ctx.has_bias = call, b is not None
        ctx.save_for_backward(x if call.save_shard else xg, w if call.regather else wg)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        call: _Call = ctx.call
        st, m = call.steps, call.mesh
        x_saved, w_saved = ctx.saved_tensors
        dx = dw = db = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = _run(dy.reshape(-1, dy.shape[-1]).sum(0), st.db, m, "grad_bias")
        dyg = _run(dy, st.dy, m, "grad_output")
        if ctx.needs_input_grad[0]:
            wg = _run_stored(w_saved, st.w_fwd, call, "weight") if call.regather else w_saved
            dx = _run(dyg @ _nk(wg, call.transposed), st.dx, m, "grad_input")
        if ctx.needs_input_grad[1]:
            xg = _run(x_saved, st.x_fwd, m, "input") if call.save_shard else x_saved
            dw = dyg.reshape(-1, dyg.shape[-1]).t() @ xg.reshape(-1, xg.shape[-1])  # (N_loc, K_eff)
            dw = dw.t().contiguous() if call.transposed else dw
            dw = _run_stored(dw, st.dw_scatter, call, "grad_weight")
            dw = _run_stored(dw, st.dw_reduce, call, "grad_weight")
        return dx, dw, db, None


class ParallelLinear(nn.Module):
    """A linear layer split over a device mesh by `scheme` (a `cost_models.linear_scheme.LinearScheme`, or
    a scheme name with default options).

    in_features K, out_features N: the dense sizes. weight: this rank's block of W ([N, K], or [K, N]
    when `weight_transposed`, as HF Conv1D stores it). interleave=k: the output features are k segments
    (fused q/k/v), each split on its own; W's rows are sharded per segment. token_shape: global sizes of
    the token dims of the input (batch, sequence); only needed when the token axes do not all fit on the
    batch dim (by default the global tokens are the local ones times the split of the batch dim).
    """

    def __init__(self, in_features: int, out_features: int, mesh: DeviceMesh, scheme: LinearScheme | str, *,
                 bias: bool = True, interleave: int = 1, weight_transposed: bool = False,
                 token_shape: Sequence[int] | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", init_fn: ParamInit | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.mesh = mesh
        self.in_features, self.out_features, self.interleave = in_features, out_features, interleave
        self.weight_transposed = weight_transposed
        self.token_shape = tuple(token_shape) if token_shape is not None else None
        self._requested = LinearScheme(scheme) if isinstance(scheme, str) else scheme
        self._plans: dict[tuple[int, ...], LinearPlan] = {}
        self._by_shape: dict[tuple, _Call] = {}  # (local input shape, token_shape) -> resolved steps
        # The weight's placement does not depend on the tokens: take it from tokens every split divides.
        nominal = (mesh.mesh.world_size ** 2,)
        self.scheme, self.plan = self._scheme_plan(nominal + (in_features,))
        rank = mesh.rank
        w_shape = self._local_shape((out_features, in_features), self.plan.w_store)
        self.weight = nn.Parameter(init_shard("weight", self._stored(w_shape), self.weight_dims, mesh.mesh, rank,
                                              init_fn=init_fn, generator=generator, dtype=dtype, device=device))
        self.bias = None
        if bias:
            b_shape = self._local_shape((out_features,), self.bias_dims)
            self.bias = nn.Parameter(init_shard("bias", b_shape, self.bias_dims, mesh.mesh, rank, init_fn=init_fn,
                                                generator=generator, dtype=dtype, device=device))

    def _scheme_plan(self, x_shape: tuple[int, ...]) -> tuple[LinearScheme, LinearPlan]:
        try:
            return linear_plan(self._requested, x_shape, self.out_features, self.mesh.mesh, self.interleave)
        except LinearSchemeError as e:
            raise ShardingError(str(e)) from None

    # --- placement -----------------------------------------------------------------------------
    def _local_shape(self, shape: tuple[int, ...], dims: Sequence[Axes]) -> tuple[int, ...]:
        return tuple(s // self.mesh.size(axes) for s, axes in zip(shape, dims))

    def _stored(self, nk: tuple[_T, _T]) -> tuple[_T, _T]:
        """A per-dim value of W in [N, K] orientation, in the stored orientation."""
        return (nk[1], nk[0]) if self.weight_transposed else nk

    @property
    def weight_dims(self) -> tuple[Axes, Axes]:
        """Axes splitting each dim of the stored weight."""
        return self._stored(self.plan.w_store)

    @property
    def weight_interleave(self) -> int:
        """Segments W's N dim is stored in (fused q/k/v rows sharded per segment)."""
        return self.plan.w_interleave

    @property
    def weight_interleave_dim(self) -> int:
        return 1 if self.weight_transposed else 0

    @property
    def bias_dims(self) -> tuple[Axes]:
        return self.plan.bias_layout.dims  # type: ignore[return-value]

    @property
    def bias_interleave(self) -> int:
        return self.plan.bias_layout.interleave

    def stored_placement(self, attr: str) -> StoredPlacement:
        """How parameter `attr` ("weight" or "bias") is stored."""
        if attr == "bias":
            return StoredPlacement(tuple(self.bias_dims), self.bias_interleave, 0)
        return StoredPlacement(tuple(self.weight_dims), self.weight_interleave, self.weight_interleave_dim)

    def plan_for(self, shape: Sequence[int]) -> LinearPlan:
        """The plan for an input of global shape [*tokens, K]."""
        shape = tuple(int(s) for s in shape)
        if shape not in self._plans:
            self._plans[shape] = self._scheme_plan(shape)[1]
        return self._plans[shape]

    def input_layout(self, shape: Sequence[int]) -> Layout:
        """Layout of an input of global shape [*tokens, K]."""
        return self.plan_for(shape).x_in

    def output_layout(self, shape: Sequence[int]) -> Layout:
        """Layout of an output of global shape [*tokens, N]."""
        return self.plan_for(tuple(shape[:-1]) + (self.in_features,)).y_out

    # --- construction from / back to dense -------------------------------------------------------
    @classmethod
    def from_dense(cls, dense: nn.Module, mesh: DeviceMesh, scheme: LinearScheme | str, *, interleave: int = 1,
                   weight_transposed: bool | None = None, token_shape: Sequence[int] | None = None,
                   init_fn: ParamInit | None = None, generator: torch.Generator | None = None,
                   device: torch.device | str | None = None) -> ParallelLinear:
        """Shard an nn.Linear (or HF Conv1D: weight [K, N], detected by its class name) onto `mesh`.

        A dense module on the meta device is never materialised: each rank allocates its own blocks and
        fills them with `init_fn(name, block, generator)` (default: `shard.default_init`), the generator
        seeded per block from `generator` so that replicas agree."""
        if weight_transposed is None:
            weight_transposed = type(dense).__name__ == "Conv1D"
        w = dense.weight
        k, n = (w.shape[0], w.shape[1]) if weight_transposed else (w.shape[1], w.shape[0])
        meta = w.device.type == "meta"
        out = cls(k, n, mesh, scheme, bias=getattr(dense, "bias", None) is not None, interleave=interleave,
                  weight_transposed=weight_transposed, token_shape=token_shape, dtype=w.dtype,
                  device=device or ("cpu" if meta else w.device), init_fn=init_fn, generator=generator)
        if not meta:
            with torch.no_grad():
                out.weight.copy_(local_block(w.detach(), out.weight_dims, mesh.mesh, mesh.rank,
                                             interleave=out.weight_interleave,
                                             interleave_dim=out.weight_interleave_dim))
                if out.bias is not None:
                    out.bias.copy_(local_block(dense.bias.detach(), out.bias_dims, mesh.mesh, mesh.rank,
                                               interleave=out.bias_interleave))
        return out

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weight (and bias) on every rank, keys and shapes as in the dense module (collective)."""
        out = {"weight": gather_tensor(self.weight, self.weight_dims, self.mesh, interleave=self.weight_interleave,
                                       interleave_dim=self.weight_interleave_dim)}
        if self.bias is not None:
            out["bias"] = gather_tensor(self.bias, self.bias_dims, self.mesh, interleave=self.bias_interleave)
        return out

    # --- forward -------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: this rank's block of the input, (*tokens_local, K_local) -> (*tokens_local', N_local)."""
        key = (tuple(x.shape), self.token_shape)
        call = self._by_shape.get(key)
        if call is None:
            call = self._by_shape[key] = self._resolve(x)
        return _LinearFn.apply(x, self.weight, self.bias, call)

    def _global_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        if self.token_shape is not None:
            return tuple(self.token_shape) + (self.in_features,)
        # Every token split on the batch dim, sequence-parallel axes on the last token dim: the layout of
        # tokens every split divides, with as many token dims as x has.
        nominal = self.plan_for((self.mesh.mesh.world_size ** 2,) * (x.dim() - 1) + (self.in_features,)).x_in
        return tuple(s * self.mesh.size(d) for s, d in zip(x.shape[:-1], nominal.dims[:-1])) + (self.in_features,)

    def _resolve(self, x: torch.Tensor) -> _Call:
        if x.dim() < 2:
            raise ShardingError(f"ParallelLinear needs an input of shape [*tokens, features], got {tuple(x.shape)}")
        shape = self._global_shape(x)
        plan = self.plan_for(shape)
        try:
            want = plan.x_in.local_shape(shape, self.mesh.mesh)
        except LayoutError as e:
            raise ShardingError(f"{self.scheme} linear input of global shape {shape}: {e}") from None
        if tuple(x.shape) != want:
            raise ShardingError(
                f"{self.scheme.name} linear expects its input block in layout {plan.x_in} of global shape "
                f"{shape}, i.e. local shape {want}, got {tuple(x.shape)}; "
                "pass token_shape= the global (batch, sequence) sizes, or redistribute the input first"
            )
        steps = linear_steps(plan, shape, self.out_features, x.element_size(), self.weight.element_size(),
                             self.mesh.mesh)
        return _Call(self.mesh, steps, plan.save_input == "in" and bool(steps.x_fwd),
                     plan.regather_weight and bool(steps.w_fwd), self.weight_transposed)

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, scheme={self.scheme}, interleave={self.interleave}, "
                f"bias={self.bias is not None}")


@builds("linear")
def build_linear(req: LayerRequest) -> ParallelLinear:
    """A planned linear (nn.Linear, HF Conv1D, F.linear, aten.addmm): the scheme value its options name."""
    w = req.param("weight")
    if w is None:
        raise LayerBuildError(f"linear op {req.op.name} has no weight parameter")
    dense = SimpleNamespace(weight=w, bias=req.param("bias"))
    return ParallelLinear.from_dense(dense, req.mesh, LinearScheme.from_options(req.scheme, dict(req.options)),
                                     interleave=int(req.option("interleave", 1)),
                                     weight_transposed=bool(req.op.attrs.get("weight_transposed")),
                                     token_shape=req.op.input_meta[0].shape[:-1], generator=req.generator,
                                     device=req.device)
