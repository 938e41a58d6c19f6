"""ParallelLinear: y = x W^T + b for every scheme of docs/ARCHITECTURE.md, on local shards.

The module holds only this rank's blocks of W and b (placed by `LinearGeometry`), takes this rank's block
of x in the scheme's input layout and returns its block of y in the output layout. One autograd function
runs the scheme's forward collectives and, in backward, its gradient collectives, the weight/bias gradient
reductions over the data-parallel axes included (so gradients are complete when backward returns).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn
from torch.nn import functional as F

from cost_models.layout import Layout
from layers3d.comm import all_gather, all_reduce, reduce_scatter
from layers3d.errors import ShardingError
from layers3d.linear_plan import LinearGeometry, LinearScheme, Reduction, default_token_shape
from layers3d.mesh import DeviceMesh
from layers3d.shard import ParamInit, gather_tensor, init_shard, local_block

__all__ = ["ParallelLinear"]

Axes = tuple[str, ...]
_T = TypeVar("_T")


@dataclass(frozen=True)
class _Call:
    """A geometry resolved to tensor dims for one input shape (what the autograd function needs)."""

    mesh: DeviceMesh
    in_gather: tuple[Axes, int] | None   # on x
    w_gather: tuple[Axes, int] | None    # on W as stored
    w_regather: bool
    out_reduce: tuple[str, Axes, int] | None  # on y
    grad_in: tuple[str, Axes, int] | None     # on dx
    w_grad_ar: Axes
    b_grad_ar: Axes
    save_shard: bool
    transposed: bool


def _reduce(t: torch.Tensor, red: tuple[str, Axes, int] | None, mesh: DeviceMesh, tag: str) -> torch.Tensor:
    if red is None:
        return t
    kind, axes, dim = red
    return all_reduce(t, axes, mesh, tag=tag) if kind == "all_reduce" else reduce_scatter(t, dim, axes, mesh, tag=tag)


def _nk(w: torch.Tensor, transposed: bool) -> torch.Tensor:
    return w.t() if transposed else w  # (N_loc, K_loc) view of W as stored


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, call: _Call) -> torch.Tensor:
        m = call.mesh
        xg = all_gather(x, call.in_gather[1], call.in_gather[0], m, tag="input") if call.in_gather else x
        wg = all_gather(w, call.w_gather[1], call.w_gather[0], m, tag="weight") if call.w_gather else w
        y = F.linear(xg, _nk(wg, call.transposed))            # (*tok_g, N_loc), partial over the contraction axes
        y = _reduce(y, call.out_reduce, m, "output")          # (*tok_y, N_loc), complete
        y = y + b if b is not None else y
        ctx.call, ctx.has_bias = call, b is not None
        ctx.save_for_backward(x if call.save_shard else xg, w if call.w_regather else wg)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        call: _Call = ctx.call
        m = call.mesh
        x_saved, w_saved = ctx.saved_tensors
        dx = dw = db = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = all_reduce(dy.reshape(-1, dy.shape[-1]).sum(0), call.b_grad_ar, m, tag="grad_bias")
        red = call.out_reduce
        dyg = all_gather(dy, red[2], red[1], m, tag="grad_output") if red and red[0] == "reduce_scatter" else dy
        if ctx.needs_input_grad[0]:
            wg = w_saved
            if call.w_regather and call.w_gather:
                wg = all_gather(w_saved, call.w_gather[1], call.w_gather[0], m, tag="weight")
            dx = _reduce(dyg @ _nk(wg, call.transposed), call.grad_in, m, "grad_input")  # (*tok_x, K_x)
        if ctx.needs_input_grad[1]:
            xg = x_saved
            if call.save_shard and call.in_gather:
                xg = all_gather(x_saved, call.in_gather[1], call.in_gather[0], m, tag="input")
            dw = dyg.reshape(-1, dyg.shape[-1]).t() @ xg.reshape(-1, xg.shape[-1])  # (N_loc, K_g)
            dw = dw.t().contiguous() if call.transposed else dw
            if call.w_gather:
                dw = reduce_scatter(dw, call.w_gather[1], call.w_gather[0], m, tag="grad_weight")
            dw = all_reduce(dw, call.w_grad_ar, m, tag="grad_weight")
        return dx, dw, db, None


class ParallelLinear(nn.Module):
    """A linear layer split over a device mesh by `scheme` (see `LinearScheme`, `LinearGeometry`).

    in_features K, out_features N: the dense sizes. weight: this rank's block of W ([N, K], or [K, N]
    when `weight_transposed`, as HF Conv1D stores it). interleave=k: the output features are k segments
    (fused q/k/v), each split on its own; W's rows are sharded per segment. token_shape: global sizes of
    the token dims of the input (batch, sequence); only needed when the token axes do not all fit on the
    batch dim (by default the local batch is taken as global batch / token split).
    """

    def __init__(self, in_features: int, out_features: int, mesh: DeviceMesh, scheme: LinearScheme | str, *,
                 bias: bool = True, interleave: int = 1, weight_transposed: bool = False,
                 token_shape: Sequence[int] | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", init_fn: ParamInit | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        scheme = LinearScheme(scheme) if isinstance(scheme, str) else scheme
        self.mesh = mesh
        self.geometry = LinearGeometry(scheme, mesh.mesh, in_features, out_features, interleave)
        self.in_features, self.out_features = in_features, out_features
        self.weight_transposed = weight_transposed
        self.token_shape = tuple(token_shape) if token_shape is not None else None
        self._calls: dict[tuple[Layout, Layout], _Call] = {}
        self._by_shape: dict[tuple, _Call] = {}  # (local input shape, token_shape) -> resolved collectives
        g, rank = self.geometry, mesh.rank
        w_shape = self._local_shape((out_features, in_features), g.w_dims)
        self.weight = nn.Parameter(init_shard("weight", self._stored(w_shape), self.weight_dims, mesh.mesh, rank,
                                              init_fn=init_fn, generator=generator, dtype=dtype, device=device))
        self.bias = None
        if bias:
            b_shape = self._local_shape((out_features,), (g.y_feat,))
            self.bias = nn.Parameter(init_shard("bias", b_shape, (g.y_feat,), mesh.mesh, rank, init_fn=init_fn,
                                                generator=generator, dtype=dtype, device=device))

    # --- placement -----------------------------------------------------------------------------
    def _local_shape(self, shape: tuple[int, ...], dims: Sequence[Axes]) -> tuple[int, ...]:
        return tuple(s // self.mesh.size(axes) for s, axes in zip(shape, dims))

    def _stored(self, nk: tuple[_T, _T]) -> tuple[_T, _T]:
        """A per-dim value of W in [N, K] orientation, in the stored orientation."""
        return (nk[1], nk[0]) if self.weight_transposed else nk

    @property
    def weight_dims(self) -> tuple[Axes, Axes]:
        """Axes splitting each dim of the stored weight."""
        return self._stored(self.geometry.w_dims)

    @property
    def weight_interleave_dim(self) -> int:
        return 1 if self.weight_transposed else 0

    def input_layout(self, shape: Sequence[int]) -> Layout:
        """Layout of an input of global shape [*tokens, K]."""
        return self.geometry.x_layout(shape)

    def output_layout(self, shape: Sequence[int]) -> Layout:
        """Layout of an output of global shape [*tokens, N]."""
        return self.geometry.y_layout(shape)

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
                                             interleave=out.geometry.w_interleave,
                                             interleave_dim=out.weight_interleave_dim))
                if out.bias is not None:
                    out.bias.copy_(local_block(dense.bias.detach(), (out.geometry.y_feat,), mesh.mesh, mesh.rank,
                                               interleave=interleave))
        return out

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weight (and bias) on every rank, keys and shapes as in the dense module (collective)."""
        g = self.geometry
        out = {"weight": gather_tensor(self.weight, self.weight_dims, self.mesh, interleave=g.w_interleave,
                                       interleave_dim=self.weight_interleave_dim)}
        if self.bias is not None:
            out["bias"] = gather_tensor(self.bias, (g.y_feat,), self.mesh, interleave=g.interleave)
        return out

    # --- forward -------------------------------------------------------------------------------
    def _call(self, xl: Layout, yl: Layout) -> _Call:
        key = (xl, yl)
        if key not in self._calls:
            g = self.geometry

            def dim_of(layout: Layout, red: Reduction) -> int:
                if red.where == "feature":
                    return layout.ndim - 1
                if red.where == "seq":
                    return layout.ndim - 2
                d = next(d for d, axes in enumerate(layout.dims) if red.axes[0] in axes)
                assert layout.dims[d][-len(red.axes):] == red.axes, (layout, red)
                return d

            def resolved(layout: Layout, red: Reduction | None) -> tuple[str, Axes, int] | None:
                return None if red is None else (red.kind, red.axes, dim_of(layout, red) if red.where else -1)

            ig = resolved(xl, g.in_gather)
            wg = g.w_gather
            self._calls[key] = _Call(
                self.mesh, (ig[1], ig[2]) if ig else None,
                (wg[0], (1 - wg[1]) if self.weight_transposed else wg[1]) if wg else None, g.w_regather,
                resolved(yl, g.out_reduce), resolved(xl, g.grad_in_reduce), g.w_grad_ar, g.b_grad_ar,
                g.scheme.save_input == "shard", self.weight_transposed)
        return self._calls[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: this rank's block of the input, (*tokens_local, K_local) -> (*tokens_local', N_local)."""
        key = (tuple(x.shape), self.token_shape)
        call = self._by_shape.get(key)
        if call is None:
            call = self._by_shape[key] = self._resolve(x)
        return _LinearFn.apply(x, self.weight, self.bias, call)

    def _resolve(self, x: torch.Tensor) -> _Call:
        g = self.geometry
        if x.dim() < 2:
            raise ShardingError(f"ParallelLinear needs an input of shape [*tokens, features], got {tuple(x.shape)}")
        tok = self.token_shape or default_token_shape(x.shape[:-1], g.x_tok, g.x_seq, self.mesh.mesh)
        xl = g.x_layout(tuple(tok) + (self.in_features,))
        want = xl.local_shape(tuple(tok) + (self.in_features,), self.mesh.mesh)
        if tuple(x.shape) != want:
            raise ShardingError(
                f"{g.name} linear expects its input block in layout {xl} of global shape "
                f"{tuple(tok) + (self.in_features,)}, i.e. local shape {want}, got {tuple(x.shape)}; "
                "pass token_shape= the global (batch, sequence) sizes, or redistribute the input first"
            )
        return self._call(xl, g.y_layout(tuple(tok) + (self.out_features,)))

    def extra_repr(self) -> str:
        s = self.geometry.scheme
        opts = f", sp={s.sp}" if s.sp else ""
        opts += f", save_input={s.save_input}" if s.name == "3d" else ""
        opts += ", weight_shard=True" if s.weight_shard else ""
        return (f"{self.in_features}, {self.out_features}, scheme={s.name}, roles={s.roles}, dp={s.dp}{opts}, "
                f"interleave={self.geometry.interleave}, bias={self.bias is not None}")
