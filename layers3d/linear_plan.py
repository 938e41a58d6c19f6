"""Which tensors a parallel linear splits over which axes, and which collectives it runs: pure data.

`LinearScheme` is the user's choice (scheme name, role axes, data-parallel axes, options);
`LinearGeometry` resolves it for one weight shape into parameter placements, activation layouts and the
collectives of docs/ARCHITECTURE.md's scheme table (y = x W^T + b, x: [*tokens, K], W: [N, K]):

| scheme        | x             | W stored        | forward                          | backward                              |
|---------------|---------------|-----------------|----------------------------------|---------------------------------------|
| replicate     | tok/(dp)      | full            | -                                | AR dW over dp                         |
| fsdp          | tok/(dp)      | N/dp (else K/dp) | AG W over dp                     | AG W, RS dW over dp                   |
| 1d_col (T)    | tok/(dp)      | N/T             | (sp: AG x over T on seq)         | AR dX over T (sp: RS dX on seq)       |
| 1d_row (T)    | tok/(dp), K/T | K/T             | AR y over T (sp: RS y on seq)    | (sp: AG dY over T on seq)             |
| 2d (r, c)     | tok/(dp,r),K/c| N/c, K/r        | AG x over c, AG W over r         | RS dX over c, RS dW over r            |
| 3d (w, i, o)  | tok/(dp,w,i),K/o | N/i, K/(o,w) | AG x over i, AG W over w, RS y over o | AG dY over o, RS dX over i, RS dW over w |
| 3d_allreduce (m, k, n) | tok/(dp,m), K/k | N/n, K/k (ws: K/(k,m)) | AR y over k | AR dX over n, AR dW over (dp, m) |

Parameter gradients are then all-reduced over dp (tag grad_weight; fsdp reduce-scatters instead); the bias
gradient over every axis that splits y's tokens (tag grad_bias, as cost_models.strategies prices it).
save_input="shard" (2d, 3d, 1d_col with sp) keeps x's shard and all-gathers it again in backward (tag input).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.layout import Layout, LayoutError, split_tokens
from cost_models.mesh import Mesh
from layers3d.errors import ShardingError
from layers3d.shard import check_divisible

__all__ = ["LINEAR_SCHEMES", "LinearScheme", "LinearGeometry", "Reduction", "token_dims", "default_token_shape"]

Axes = tuple[str, ...]
LINEAR_SCHEMES = ("replicate", "fsdp", "1d_col", "1d_row", "2d", "3d", "3d_allreduce")
_N_ROLES = {"replicate": (0,), "fsdp": (0,), "2d": (2,), "3d": (3,), "3d_allreduce": (3,)}


@dataclass(frozen=True)
class LinearScheme:
    """How one linear is parallelised.

    name: one of LINEAR_SCHEMES.
    roles: the scheme's axes. 1d_col/1d_row: the tensor-parallel axes T (one or more, outermost first);
        2d: (r, c); 3d: (w, i, o) = (weight, input, output) axes; 3d_allreduce: (m, k, n) = the axes
        splitting tokens, the contraction dim K and the output features N; replicate/fsdp: ().
    dp: data-parallel axes splitting the tokens (batch first); None = every mesh axis not in roles.
        Mesh axes in neither are replicas: they compute the same shard and need no reduction.
    sp: 1d only: sequence parallelism (the sequence dim is also split over T outside the layer).
    save_input: schemes that all-gather their input (3d, 2d, 1d_col with sp): "gathered" saves the
        gathered input, "shard" the local shard (gathered again in backward, tag input).
    weight_shard: 3d_allreduce only: W's K dim also split over m, all-gathered before use.
    shard_dim: fsdp only: the dim of W in [N, K] orientation split over dp (None: N when dp divides it,
        else K; the option of the same name in cost_models.strategies.linear).
    """

    name: str
    roles: Axes = ()
    dp: Axes | None = None
    sp: bool = False
    save_input: str = "gathered"
    weight_shard: bool = False
    shard_dim: int | None = None

    def resolve(self, mesh: Mesh) -> LinearScheme:
        """Validate against `mesh` and fill in dp; raises ShardingError naming what is wrong."""
        if self.name not in LINEAR_SCHEMES:
            raise ShardingError(f"unknown linear scheme {self.name!r}; choose one of {LINEAR_SCHEMES}")
        roles = tuple(self.roles)
        want = _N_ROLES.get(self.name)
        if (want is not None and len(roles) not in want) or (want is None and not roles):
            need = "one or more tensor-parallel axes" if want is None else f"{want[0]} role axes"
            raise ShardingError(f"scheme {self.name} needs {need}, got roles={roles}")
        for a in roles + tuple(self.dp or ()):
            if a not in mesh.axis_names:
                raise ShardingError(f"unknown mesh axis {a!r} for scheme {self.name}; mesh {mesh} has {mesh.axis_names}")
        dp = tuple(a for a in mesh.axis_names if a not in roles) if self.dp is None else tuple(self.dp)
        if len(set(roles)) != len(roles) or set(roles) & set(dp) or len(set(dp)) != len(dp):
            raise ShardingError(f"scheme {self.name}: roles {roles} and dp {dp} must be distinct mesh axes")
        if self.sp and self.name not in ("1d_col", "1d_row"):
            raise ShardingError(f"sp (sequence parallelism) applies to 1d_col/1d_row, not {self.name}")
        gathers_input = self.name in ("2d", "3d") or (self.name == "1d_col" and self.sp)
        if self.save_input not in ("gathered", "shard") or (self.save_input == "shard" and not gathers_input):
            raise ShardingError(f"save_input={self.save_input!r}: use 'gathered', or 'shard' with a scheme that "
                                "gathers its input (2d, 3d, 1d_col with sp)")
        if self.weight_shard and self.name != "3d_allreduce":
            raise ShardingError(f"weight_shard applies to 3d_allreduce only, not {self.name}")
        if self.shard_dim is not None and (self.name != "fsdp" or self.shard_dim not in (0, 1)):
            raise ShardingError(f"shard_dim={self.shard_dim!r} applies to fsdp only and must be 0 or 1")
        return LinearScheme(self.name, roles, dp, self.sp, self.save_input, self.weight_shard, self.shard_dim)


@dataclass(frozen=True)
class Reduction:
    """A collective on an activation: kind ("all_gather" / "reduce_scatter" / "all_reduce"), axes, and
    where it acts: "feature" (last dim), "seq" (last token dim) or "token" (the token dim holding the axes)."""

    kind: str
    axes: Axes
    where: str = ""


def default_token_shape(local: Sequence[int], token_axes: Axes, seq_axes: Axes, mesh: Mesh) -> tuple[int, ...]:
    """Global token dims when only the local ones are known: every token axis on the batch dim, the
    sequence-parallel axes on the last token dim (what split_tokens gives when the batch divides)."""
    out = list(local)
    out[0] *= mesh.size(token_axes)
    out[-1] *= mesh.size(seq_axes)
    return tuple(out)


def token_dims(tok_shape: Sequence[int], token_axes: Axes, seq_axes: Axes, mesh: Mesh, what: str) -> tuple[Axes, ...]:
    """Per token dim, the axes splitting it: `split_tokens` over token_axes, then seq_axes appended to the
    last token dim (sequence parallelism)."""
    dims = split_tokens(tuple(tok_shape), len(tok_shape), token_axes, mesh)
    if dims is None:
        raise ShardingError(
            f"{what}: token dims {tuple(tok_shape)} cannot be split over mesh axes {token_axes} "
            f"({mesh.size(token_axes)} ways, batch first); make the batch size (times sequence) divisible by it"
        )
    return dims[:-1] + (dims[-1] + seq_axes,)


@dataclass(frozen=True)
class LinearGeometry:
    """A `LinearScheme` resolved for a weight of N = out_features by K = in_features on `mesh`."""

    scheme: LinearScheme
    mesh: Mesh
    in_features: int
    out_features: int
    interleave: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "scheme", self.scheme.resolve(self.mesh))
        k, n = self.in_features, self.out_features
        fix = "choose feature sizes divisible by the split, or another scheme or mesh"
        (wn, wk), (xk, yn) = self.w_dims, (self.x_feat, self.y_feat)
        segs = self.interleave if wn else 1
        check_divisible(n, wn, self.mesh, f"{self.scheme.name} linear out_features (weight dim N)", fix, segs)
        check_divisible(n, yn, self.mesh, f"{self.scheme.name} linear out_features (output feature dim)", fix,
                        self.interleave if yn else 1)
        check_divisible(k, wk, self.mesh, f"{self.scheme.name} linear in_features (weight dim K)", fix)
        check_divisible(k, xk, self.mesh, f"{self.scheme.name} linear in_features (input feature dim)", fix)

    @property
    def dp(self) -> Axes:
        return self.scheme.dp or ()

    @property
    def name(self) -> str:
        return self.scheme.name

    # --- placements ----------------------------------------------------------------------------
    @property
    def w_dims(self) -> tuple[Axes, Axes]:
        """Axes splitting W's dims in [N, K] orientation."""
        s, r = self.name, self.scheme.roles
        if s == "replicate":
            return ((), ())
        if s == "fsdp":
            dim = self.scheme.shard_dim
            if dim is None:
                dim = 0 if self.out_features % self.mesh.size(self.dp) == 0 else 1
            return (self.dp, ()) if dim == 0 else ((), self.dp)
        if s == "1d_col":
            return (r, ())
        if s == "1d_row":
            return ((), r)
        if s == "2d":
            return (r[1:2], r[0:1])
        if s == "3d":
            return (r[1:2], r[2:3] + r[0:1])
        return (r[2:3], r[1:2] + (r[0:1] if self.scheme.weight_shard else ()))

    @property
    def w_interleave(self) -> int:
        """Segments W's N dim is split in (fused q/k/v rows are sharded per segment)."""
        return self.interleave if self.w_dims[0] and self.name != "fsdp" else 1

    # --- activations (token axes, sequence axes, feature axes) ----------------------------------
    @property
    def x_tok(self) -> Axes:
        r = self.scheme.roles
        return self.dp + {"2d": r[:1], "3d": r[:2], "3d_allreduce": r[:1]}.get(self.name, ())

    @property
    def x_seq(self) -> Axes:
        return self.scheme.roles if self.name == "1d_col" and self.scheme.sp else ()

    @property
    def x_feat(self) -> Axes:
        return {"1d_row": self.scheme.roles, "2d": self.scheme.roles[1:], "3d": self.scheme.roles[2:],
                "3d_allreduce": self.scheme.roles[1:2]}.get(self.name, ())

    @property
    def y_tok(self) -> Axes:
        r = self.scheme.roles
        return self.dp + {"2d": r[:1], "3d": r[:1] + r[2:3], "3d_allreduce": r[:1]}.get(self.name, ())

    @property
    def y_seq(self) -> Axes:
        return self.scheme.roles if self.name == "1d_row" and self.scheme.sp else ()

    @property
    def y_feat(self) -> Axes:
        return {"1d_col": self.scheme.roles, "2d": self.scheme.roles[1:], "3d": self.scheme.roles[1:2],
                "3d_allreduce": self.scheme.roles[2:]}.get(self.name, ())

    def x_layout(self, shape: Sequence[int]) -> Layout:
        """Layout of the input of global shape [*tokens, K]."""
        dims = token_dims(shape[:-1], self.x_tok, self.x_seq, self.mesh, f"{self.name} linear input")
        return _checked(Layout(dims + (self.x_feat,)), shape, self.mesh, f"{self.name} linear input")

    def y_layout(self, shape: Sequence[int]) -> Layout:
        """Layout of the output of global shape [*tokens, N]."""
        dims = token_dims(shape[:-1], self.y_tok, self.y_seq, self.mesh, f"{self.name} linear output")
        inter = self.interleave if self.y_feat else 1  # segments matter only on a split dim
        return _checked(Layout(dims + (self.y_feat,), interleave=inter), shape, self.mesh,
                        f"{self.name} linear output")

    # --- collectives ---------------------------------------------------------------------------
    @property
    def in_gather(self) -> Reduction | None:
        """All-gather of x before the matmul (tag input)."""
        r = self.scheme.roles
        if self.name == "1d_col" and self.scheme.sp:
            return Reduction("all_gather", r, "seq")
        if self.name == "2d":
            return Reduction("all_gather", r[1:], "feature")
        if self.name == "3d":
            return Reduction("all_gather", r[1:2], "token")
        return None

    @property
    def w_gather(self) -> tuple[Axes, int] | None:
        """(axes, dim of W in [N, K] orientation) of the all-gather of W before use (tag weight)."""
        s, roles = self.name, self.scheme.roles
        if s == "fsdp" and self.dp:
            return (self.dp, 0 if self.w_dims[0] else 1)
        if s in ("2d", "3d") or (s == "3d_allreduce" and self.scheme.weight_shard):
            return (roles[:1], 1)  # r, w or m: always the innermost axis of W's K dim
        return None

    @property
    def w_regather(self) -> bool:
        """Whether backward gathers W again (fsdp, 3d_allreduce weight_shard) instead of keeping it."""
        return self.name == "fsdp" or (self.name == "3d_allreduce" and self.scheme.weight_shard)

    @property
    def out_reduce(self) -> Reduction | None:
        roles = self.scheme.roles
        if self.name == "1d_row":
            return Reduction("reduce_scatter", roles, "seq") if self.scheme.sp else Reduction("all_reduce", roles)
        if self.name == "3d":
            return Reduction("reduce_scatter", roles[2:], "token")
        if self.name == "3d_allreduce":
            return Reduction("all_reduce", roles[1:2])
        return None

    @property
    def grad_in_reduce(self) -> Reduction | None:
        roles = self.scheme.roles
        if self.name == "1d_col":
            return Reduction("reduce_scatter", roles, "seq") if self.scheme.sp else Reduction("all_reduce", roles)
        if self.name == "2d":
            return Reduction("reduce_scatter", roles[1:], "feature")
        if self.name == "3d":
            return Reduction("reduce_scatter", roles[1:2], "token")
        if self.name == "3d_allreduce":
            return Reduction("all_reduce", roles[2:])
        return None

    @property
    def w_grad_ar(self) -> Axes:
        """Axes of the all-reduce of dW after its reduce-scatter (if any)."""
        if self.name == "fsdp":
            return ()
        if self.name == "3d_allreduce" and not self.scheme.weight_shard:
            return self.dp + self.scheme.roles[:1]
        return self.dp

    @property
    def b_grad_ar(self) -> Axes:
        return self.y_tok + self.y_seq


def _checked(layout: Layout, shape: Sequence[int], mesh: Mesh, what: str) -> Layout:
    try:
        layout.local_shape(tuple(shape), mesh)
    except LayoutError as e:
        raise ShardingError(f"{what} of global shape {tuple(shape)}: {e}; make that dim divisible or choose "
                            "other axes") from None
    return layout
