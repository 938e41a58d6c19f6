"""A linear scheme as a value: the options, the layouts and the collective steps of y = x W^T + b.

This module is the one definition of every linear scheme (docs/ARCHITECTURE.md, "Schemes for a linear
op"). The cost model prices the `LinearSteps` of a plan and the runtime (`layers3d.ParallelLinear`)
executes the same `LinearSteps` one to one, so what is priced is what runs by construction:

    LinearScheme (name + typed options)  --linear_plans / linear_plan-->  LinearPlan (five layouts)
    LinearPlan + shapes  --linear_steps-->  LinearSteps (the redistribution steps of both passes)

    forward    x_in -> x_eff (input), W_store -> W_eff (weight), y_eff -> y_out (output)
    backward   dY: the reverse of the output steps (grad_output); dX: partial over the axes that split
               N -> x_in (grad_input); dW: partial over x_eff's token axes -> reduce-scatter over the
               axes W_store adds to W_eff, all-reduce over the rest (grad_weight); db: all-reduce over
               y_out's token axes (grad_bias)

with y_eff = (x_eff's token splits, W_eff's N splits) + partial over the axes splitting K. W is always
described in [N, K] orientation (HF Conv1D stores [K, N]: the caller transposes its view).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import combinations, permutations
from typing import Any

from cost_models.errors import PlannerError
from cost_models.layout import Axes, Layout, token_layout
from cost_models.mesh import Mesh
from cost_models.redistribution import Step, backward_steps, plan_redistribution
from cost_models.schemes import Scheme

__all__ = ["LinearScheme", "LinearPlan", "LinearSteps", "LinearSchemeError", "linear_plans", "linear_plan",
           "linear_steps"]


class LinearSchemeError(PlannerError, ValueError):
    """A linear scheme the mesh or the shapes do not allow (names the scheme and what does not divide)."""


_N_ROLES = {Scheme.REPLICATE: 0, Scheme.FSDP: 0, Scheme.TWO_D: 2, Scheme.THREE_D: 3, Scheme.THREE_D_ALLREDUCE: 3}
_GATHERS_INPUT = (Scheme.TWO_D, Scheme.THREE_D)


@dataclass(frozen=True)
class LinearScheme:
    """How one linear is parallelised: a scheme name and its typed options.

    roles: the scheme's axes. 1d_col/1d_row: the tensor-parallel axes T (outermost first); 2d: (r, c);
        3d: (w, i, o) = (weight, input, output) axes; 3d_allreduce: (m, k, n) = the axes splitting tokens,
        the contraction dim K and the output features N; replicate/fsdp: ().
    dp: data-parallel axes splitting the tokens; None = every mesh axis not in roles. replicate with
        dp=() is the fully replicated linear (every rank computes everything).
    sp: 1d only: sequence parallelism (the sequence dim is also split over T outside the layer).
    save_input: schemes that all-gather their input (2d, 3d, 1d_col with sp): "gathered" saves the
        gathered input, "shard" the local shard (gathered again in backward).
    weight_shard: 3d_allreduce only: W's K dim also split over m, all-gathered before use.
    shard_dim: fsdp only: the dim of W ([N, K]) split over dp; None: N when dp divides it, else K.
    """

    name: str
    roles: Axes = ()
    dp: Axes | None = None
    sp: bool = False
    save_input: str = "gathered"
    weight_shard: bool = False
    shard_dim: int | None = None

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> LinearScheme:
        """The scheme of a planned linear (a strategy's or a plan assignment's options)."""
        def axes(v: Any) -> Axes | None:
            return None if v is None else tuple(v)
        roles = options.get("T") if name in (Scheme.ONE_D_COL, Scheme.ONE_D_ROW) else options.get("roles")
        return cls(str(name), axes(roles) or (), axes(options.get("dp")), bool(options.get("sp", False)),
                   str(options.get("save_input", "gathered")), bool(options.get("weight_shard", False)),
                   options.get("shard_dim"))

    def options(self) -> dict[str, Any]:
        """The strategy options of this scheme (the keys plans have always carried)."""
        n, dp = self.name, self.dp
        if n == Scheme.REPLICATE:
            return {"dp": dp}
        if n == Scheme.FSDP:
            return {"dp": dp, "shard_dim": self.shard_dim}
        if n in (Scheme.ONE_D_COL, Scheme.ONE_D_ROW):
            extra = {"save_input": self.save_input} if n == Scheme.ONE_D_COL and self.sp else {}
            return {"T": self.roles, "dp": dp, "sp": self.sp, **extra}
        if n == Scheme.THREE_D_ALLREDUCE:
            return {"roles": self.roles, "dp": dp, "weight_shard": self.weight_shard}
        return {"roles": self.roles, "dp": dp, "save_input": self.save_input}

    def resolve(self, mesh: Mesh) -> LinearScheme:
        """Validate against `mesh` and fill in dp; raises LinearSchemeError naming what is wrong."""
        names = [s.value for s in Scheme.heavy()]
        if self.name not in names:
            raise LinearSchemeError(f"unknown linear scheme {self.name!r}; choose one of {', '.join(names)}")
        roles = tuple(self.roles)
        want = _N_ROLES.get(Scheme(self.name))
        if (want is not None and len(roles) != want) or (want is None and not roles):
            need = "one or more tensor-parallel axes" if want is None else f"{want} role axes"
            raise LinearSchemeError(f"scheme {self.name} needs {need}, got roles={roles}")
        for a in roles + tuple(self.dp or ()):
            if a not in mesh.axis_names:
                raise LinearSchemeError(f"unknown mesh axis {a!r} for scheme {self.name}; mesh {mesh} has "
                                        f"{mesh.axis_names}")
        dp = tuple(a for a in mesh.axis_names if a not in roles) if self.dp is None else tuple(self.dp)
        if len(set(roles)) != len(roles) or set(roles) & set(dp) or len(set(dp)) != len(dp):
            raise LinearSchemeError(f"scheme {self.name}: roles {roles} and dp {dp} must be distinct mesh axes")
        if self.sp and self.name not in (Scheme.ONE_D_COL, Scheme.ONE_D_ROW):
            raise LinearSchemeError(f"sp (sequence parallelism) applies to 1d_col/1d_row, not {self.name}")
        gathers = self.name in _GATHERS_INPUT or (self.name == Scheme.ONE_D_COL and self.sp)
        if self.save_input not in ("gathered", "shard") or (self.save_input == "shard" and not gathers):
            raise LinearSchemeError(f"save_input={self.save_input!r}: use 'gathered', or 'shard' with a scheme "
                                    "that gathers its input (2d, 3d, 1d_col with sp)")
        if self.weight_shard and self.name != Scheme.THREE_D_ALLREDUCE:
            raise LinearSchemeError(f"weight_shard applies to 3d_allreduce only, not {self.name}")
        if self.shard_dim is not None and (self.name != Scheme.FSDP or self.shard_dim not in (0, 1)):
            raise LinearSchemeError(f"shard_dim={self.shard_dim!r} applies to fsdp only and must be 0 or 1")
        return replace(self, roles=roles, dp=dp)

    def matches(self, other: LinearScheme) -> bool:
        """Whether `other` (a fully specified scheme) is this one (None fields match anything)."""
        return (self.name == other.name and self.roles == other.roles and self.dp == other.dp
                and self.sp == other.sp and self.save_input == other.save_input
                and self.weight_shard == other.weight_shard
                and (self.shard_dim is None or self.shard_dim == other.shard_dim))

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", str(self.name))  # a Scheme member serialises as its plain value

    def __str__(self) -> str:
        opts = ", ".join(f"{k}={''.join(v) if isinstance(v, tuple) else v}" for k, v in self.options().items())
        return f"{self.name}[{opts}]"


@dataclass(frozen=True)
class LinearPlan:
    """The layouts of one linear strategy (W in [N, K] orientation: w_n / w_k are the axes splitting N / K)."""

    x_in: Layout
    x_eff: Layout
    w_store: tuple[Axes, Axes]
    w_eff: tuple[Axes, Axes]
    y_out: Layout
    save_input: str = "eff"          # "eff": the tensor the matmul used; "in": the shard x arrived as
    regather_weight: bool = False    # fsdp / weight_shard: gather W again in backward instead of saving it
    interleave: int = 1

    @property
    def w_interleave(self) -> int:
        """Segments W's N dim is stored in: fused q/k/v rows are sharded per segment when W's N dim is split
        where it is used (a W gathered whole before use, fsdp, is stored in plain blocks)."""
        return self.interleave if self.w_eff[0] else 1

    @property
    def bias_layout(self) -> Layout:
        """The bias is stored like y's feature dim."""
        feat = self.y_out.dims[-1]
        return Layout((feat,), interleave=self.interleave if feat else 1)

    @property
    def y_eff(self) -> Layout:
        """The matmul's output: x_eff's token splits, W_eff's N splits, partial over the axes splitting K."""
        return Layout(self.x_eff.dims[:-1] + (self.w_eff[0],), partial=self.x_eff.dims[-1],
                      interleave=self.interleave if self.w_eff[0] else 1)

    @property
    def token_axes(self) -> Axes:
        """The axes splitting x_eff's tokens (dW is a partial sum over them)."""
        return tuple(a for d in self.x_eff.dims[:-1] for a in d)

    @property
    def weight_extra_axes(self) -> Axes:
        """The axes W's storage splits beyond its use (gathered before use, reduce-scattered in backward)."""
        return tuple(a for d in range(2) for a in self.w_store[d] if a not in self.w_eff[d])


def _all_subsets(names: Axes) -> list[Axes]:
    return [c for r in range(1, len(names) + 1) for c in combinations(names, r)]


def _all_triples(names: Axes, mesh: Mesh) -> list[tuple[str, str, str]]:
    """Orderings of three mesh axes of equal size (a cube)."""
    return [t for t in permutations(names, 3) if len({mesh.axis_size(a) for a in t}) == 1]




def linear_plans(x_shape: tuple[int, ...], n_out: int, mesh: Mesh, segments: int = 1, *,
                 subsets: Sequence[Axes] | None = None, pairs: Sequence[tuple[str, str]] | None = None,
                 triples: Sequence[tuple[str, str, str]] | None = None, replicas: Axes = (),
                 ) -> Iterator[tuple[LinearScheme, LinearPlan] | str]:
    """Every (scheme, plan) the shapes allow for x of global `x_shape` ([*tokens, K]) and N = `n_out`
    output features in `segments` interleaved segments, and a reason string for each that they do not.
    The axis choices default to all of them: 1d axis sets `subsets`, 2d role pairs `pairs`, 3d role
    triples `triples` (the cost model passes its symmetry-reduced lists). `replicas`: axes that neither
    split anything nor reduce anything (every rank along them computes the same; the runtime's schemes
    with an explicit dp that leaves axes out)."""
    y_shape = tuple(x_shape[:-1]) + (n_out,)
    K, N, seg = x_shape[-1], n_out, segments
    every = tuple(a for a in mesh.axis_names if a not in replicas)

    def _rest(mesh: Mesh, used: Axes) -> Axes:
        return tuple(a for a in every if a not in used)

    def divides(n: int, axes: Axes, s: int = 1) -> bool:
        return n % (mesh.size(axes) * s) == 0

    def no_tokens(label: str, axes: Axes) -> str:
        return (f"{label}: tokens {tuple(x_shape[:-1])} cannot be split over axes {''.join(axes)} "
                f"({mesh.size(axes)} ways)")

    def feat_reason(label: str, what: str, n: int, axes: Axes, s: int = 1) -> str:
        seg_txt = f" in {s} segments" if s > 1 else ""
        return f"{label}: {what} {n}{seg_txt} not divisible by {mesh.size(axes) * s} (axis {''.join(axes)})"

    x_all, y_all = token_layout(x_shape, every, mesh), token_layout(y_shape, every, mesh)
    if x_all and y_all:
        yield LinearScheme(Scheme.REPLICATE, (), every), LinearPlan(x_all, x_all, ((), ()), ((), ()), y_all)
        for dim, size in enumerate((N, K)):
            if size % mesh.size(every) == 0:
                w_store = (every, ()) if dim == 0 else ((), every)
                yield LinearScheme(Scheme.FSDP, (), every, shard_dim=dim), LinearPlan(
                    x_all, x_all, w_store, ((), ()), y_all, regather_weight=True)
                break
        else:
            yield f"fsdp: weight {N}x{K} divisible by {mesh.size(every)} on neither dim"
    else:
        yield no_tokens("replicate/fsdp", every)
    rep_x, rep_y = Layout.replicated(len(x_shape)), Layout.replicated(len(y_shape))
    yield LinearScheme(Scheme.REPLICATE, (), ()), LinearPlan(rep_x, rep_x, ((), ()), ((), ()), rep_y)

    for T in (_all_subsets(every) if subsets is None else subsets):
        dp = _rest(mesh, T)
        x_dp, y_dp = token_layout(x_shape, dp, mesh), token_layout(y_shape, dp, mesh)
        if x_dp is None or y_dp is None:
            yield no_tokens(f"1d[T={''.join(T)}]", dp)
            continue
        if divides(N, T, seg):
            y_col = token_layout(y_shape, dp, mesh, T, interleave=seg)
            yield LinearScheme(Scheme.ONE_D_COL, T, dp), LinearPlan(x_dp, x_dp, (T, ()), (T, ()), y_col,
                                                                     interleave=seg)
            x_sp = token_layout(x_shape, dp, mesh, seq_axes=T)
            if x_sp is None:
                yield f"1d_col[T={''.join(T)},sp]: sequence {tuple(x_shape[:-1])} not divisible by {mesh.size(T)}"
            else:
                for save in ("gathered", "shard"):
                    yield LinearScheme(Scheme.ONE_D_COL, T, dp, sp=True, save_input=save), LinearPlan(
                        x_sp, x_dp, (T, ()), (T, ()), y_col, "eff" if save == "gathered" else "in", interleave=seg)
        else:
            yield feat_reason(f"1d_col[T={''.join(T)}]", "out_features", N, T, seg)
        if divides(K, T):
            x_row = token_layout(x_shape, dp, mesh, T)
            yield LinearScheme(Scheme.ONE_D_ROW, T, dp), LinearPlan(x_row, x_row, ((), T), ((), T), y_dp)
            y_sp = token_layout(y_shape, dp, mesh, seq_axes=T)
            if y_sp is None:
                yield f"1d_row[T={''.join(T)},sp]: sequence {tuple(y_shape[:-1])} not divisible by {mesh.size(T)}"
            else:
                yield LinearScheme(Scheme.ONE_D_ROW, T, dp, sp=True), LinearPlan(x_row, x_row, ((), T), ((), T), y_sp)
        else:
            yield feat_reason(f"1d_row[T={''.join(T)}]", "in_features", K, T)

    for r, c in (list(permutations(every, 2)) if pairs is None else pairs):
        label = f"2d[roles={r}{c}]"
        dp = _rest(mesh, (r, c))
        if not divides(K, (c,)) or not divides(K, (r,)):
            yield feat_reason(label, "in_features", K, (c,) if not divides(K, (c,)) else (r,))
            continue
        if not divides(N, (c,), seg):
            yield feat_reason(label, "out_features", N, (c,), seg)
            continue
        x_in, x_eff = token_layout(x_shape, dp + (r,), mesh, (c,)), token_layout(x_shape, dp + (r,), mesh)
        y_out = token_layout(y_shape, dp + (r,), mesh, (c,), interleave=seg)
        if not (x_in and x_eff and y_out):
            yield no_tokens(label, dp + (r,))
            continue
        for save in ("gathered", "shard"):
            yield LinearScheme(Scheme.TWO_D, (r, c), dp, save_input=save), LinearPlan(
                x_in, x_eff, ((c,), (r,)), ((c,), ()), y_out, "eff" if save == "gathered" else "in", interleave=seg)

    for w, i, o in (_all_triples(every, mesh) if triples is None else triples):
        roles = (w, i, o)
        dp = _rest(mesh, roles)
        label = f"3d[roles={w}{i}{o}]"
        if not divides(K, (o, w)):
            yield feat_reason(label, "in_features", K, (o, w))
        elif not divides(N, (i,), seg):
            yield feat_reason(label, "out_features", N, (i,), seg)
        else:
            x_in, x_eff = token_layout(x_shape, dp + (w, i), mesh, (o,)), token_layout(x_shape, dp + (w,), mesh, (o,))
            y_out = token_layout(y_shape, dp + (w, o), mesh, (i,), interleave=seg)
            if not (x_in and x_eff and y_out):
                yield no_tokens(label, dp + (w, i))
            else:
                for save in ("gathered", "shard"):
                    yield LinearScheme(Scheme.THREE_D, roles, dp, save_input=save), LinearPlan(
                        x_in, x_eff, ((i,), (o, w)), ((i,), (o,)), y_out, "eff" if save == "gathered" else "in",
                        interleave=seg)
        m, k, n = roles
        label = f"3d_allreduce[roles={m}{k}{n}]"
        if not divides(K, (k,)):
            yield feat_reason(label, "in_features", K, (k,))
            continue
        if not divides(N, (n,), seg):
            yield feat_reason(label, "out_features", N, (n,), seg)
            continue
        x_in, y_out = token_layout(x_shape, dp + (m,), mesh, (k,)), token_layout(y_shape, dp + (m,), mesh, (n,), interleave=seg)
        if not (x_in and y_out):
            yield no_tokens(label, dp + (m,))
            continue
        yield LinearScheme(Scheme.THREE_D_ALLREDUCE, roles, dp), LinearPlan(
            x_in, x_in, ((n,), (k,)), ((n,), (k,)), y_out, interleave=seg)
        if divides(K, (k, m)):
            yield LinearScheme(Scheme.THREE_D_ALLREDUCE, roles, dp, weight_shard=True), LinearPlan(
                x_in, x_in, ((n,), (k, m)), ((n,), (k,)), y_out, regather_weight=True, interleave=seg)
        else:
            yield feat_reason(label + "[weight_shard]", "in_features", K, (k, m))


def _reason_labels(s: LinearScheme) -> tuple[str, ...]:
    """The labels `linear_plans` puts on the reasons that concern scheme `s` (resolved)."""
    r = "".join(s.roles)
    if s.name == Scheme.REPLICATE:
        return ("replicate/fsdp",)
    if s.name == Scheme.FSDP:
        return ("replicate/fsdp", "fsdp:")
    if s.name in (Scheme.ONE_D_COL, Scheme.ONE_D_ROW):
        return (f"1d[T={r}]", f"{s.name}[T={r}]", f"{s.name}[T={r},")
    return (f"{s.name}[roles={r}]",)


def linear_plan(scheme: LinearScheme, x_shape: tuple[int, ...], n_out: int, mesh: Mesh,
                segments: int = 1) -> tuple[LinearScheme, LinearPlan]:
    """The plan of one scheme (resolved: dp filled in) for these shapes, from the same enumeration the cost
    model prices; raises LinearSchemeError with the reasons the shapes refuse it."""
    want = scheme.resolve(mesh)
    x_shape = tuple(int(s) for s in x_shape)
    reasons: list[str] = []
    prefixes = _reason_labels(want)
    replicas = tuple(a for a in mesh.axis_names if a not in want.roles + (want.dp or ()))
    for item in linear_plans(x_shape, n_out, mesh, segments, replicas=replicas):
        if isinstance(item, str):
            if item.startswith(prefixes):
                reasons.append(item)
            continue
        got, plan = item
        if want.matches(got):
            return got, plan
    why = "; ".join(reasons) if reasons else "the shapes or the mesh do not allow it"
    raise LinearSchemeError(f"linear {x_shape} -> {n_out} features on mesh {mesh}: scheme {want} is not possible: "
                            f"{why}; choose sizes divisible by the split, or another scheme or mesh")


@dataclass(frozen=True)
class LinearSteps:
    """The redistribution steps of one linear plan for given global shapes (W in [N, K] orientation)."""

    x_fwd: tuple[Step, ...]   # x_in -> x_eff (tag input); run again in backward when save_input == "in"
    w_fwd: tuple[Step, ...]   # W_store -> W_eff (tag weight); run again in backward when regather_weight
    y_fwd: tuple[Step, ...]   # y_eff (partial) -> y_out (tag output)
    dy: tuple[Step, ...]      # dY in y_out -> y_eff's layout (tag grad_output)
    dx: tuple[Step, ...]      # dX partial over W_eff's N axes -> x_in (tag grad_input)
    dw_scatter: tuple[Step, ...]  # dW partial -> reduce-scattered onto W_store's extra axes (tag grad_weight)
    dw_reduce: tuple[Step, ...]   # ... then all-reduced over the remaining token axes (tag grad_weight)
    db: tuple[Step, ...]      # db partial over y_out's token axes -> the bias layout (tag grad_bias)


@lru_cache(maxsize=4096)
def linear_steps(plan: LinearPlan, x_shape: tuple[int, ...], n_out: int, x_item: int, w_item: int,
                 mesh: Mesh) -> LinearSteps:
    """Every collective of `plan` as redistribution steps (see the module docstring)."""
    y_shape = tuple(x_shape[:-1]) + (n_out,)
    w_nk = (n_out, x_shape[-1])
    if plan.x_eff.dims[-1] != plan.w_eff[1]:
        raise AssertionError(f"x_eff splits K over {plan.x_eff.dims[-1]}, W_eff over {plan.w_eff[1]}")
    x_fwd = plan_redistribution(x_shape, x_item, plan.x_in, plan.x_eff, mesh)
    w_store, w_eff = Layout(plan.w_store), Layout(plan.w_eff)
    w_fwd = plan_redistribution(w_nk, w_item, w_store, w_eff, mesh)
    y_fwd = plan_redistribution(y_shape, x_item, plan.y_eff, plan.y_out, mesh)
    dy = backward_steps(y_fwd, y_shape, x_item, mesh)
    dx = plan_redistribution(x_shape, x_item, Layout(plan.x_eff.dims, partial=plan.w_eff[0]), plan.x_in, mesh)
    extra, tokens = plan.weight_extra_axes, plan.token_axes
    if set(extra) - set(tokens):
        raise AssertionError(f"W sharded over {extra}, not all token axes of {plan.x_eff}")
    rest = tuple(a for a in tokens if a not in extra)
    dw_scatter = plan_redistribution(w_nk, w_item, Layout(plan.w_eff, partial=extra), w_store, mesh) if extra else []
    dw_reduce = plan_redistribution(w_nk, w_item, Layout(plan.w_store, partial=rest), w_store, mesh) if rest else []
    y_tokens = tuple(a for d in plan.y_out.dims[:-1] for a in d)
    b = plan.bias_layout
    db = plan_redistribution((n_out,), w_item, Layout(b.dims, partial=y_tokens, interleave=b.interleave), b, mesh) \
        if y_tokens else []
    return LinearSteps(tuple(x_fwd), tuple(w_fwd), tuple(y_fwd), tuple(dy), tuple(dx), tuple(dw_scatter),
                       tuple(dw_reduce), tuple(db))

