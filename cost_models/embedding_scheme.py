"""An embedding scheme as a value: its layouts and every collective, defined once for the cost model and
the runtime (`layers3d.ParallelEmbedding` executes the steps priced here).

y = W[ids], W: [V, H]. A scheme is a name and its options:

| scheme    | options        | W stored       | W as used | y as looked up        | y out                   |
|-----------|----------------|----------------|-----------|-----------------------|-------------------------|
| replicate | dp             | full           | full      | tokens/dp, H          | the same                |
| fsdp      | dp, shard_dim  | V/dp (or H/dp) | full      | tokens/dp, H          | the same                |
| vocab     | T, dp, sp      | V/T            | V/T       | partial over T        | tokens/dp (sp: seq/T)   |
| 1d_col    | T, dp          | H/T            | H/T       | tokens/dp, H/T        | the same                |

`replicate` with dp = () looks up every token on every rank (small tables such as position embeddings
whose output broadcasts against a batch-split tensor). A vocabulary-parallel rank looks up the ids in its
row range and writes zeros elsewhere; the reduction over T completes the rows. The backward saves the ids
only: dW (in W's used layout) is reduce-scattered onto the axes W is stored over but not used over, then
all-reduced over the remaining token axes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import Any

from cost_models.errors import PlannerError
from cost_models.layout import Axes, Layout, split_tokens
from cost_models.mesh import Mesh
from cost_models.redistribution import Step, backward_steps, plan_redistribution
from cost_models.schemes import Scheme

__all__ = ["EMBEDDING_SCHEME_NAMES", "EmbeddingSchemeError", "EmbeddingPlan", "EmbeddingSteps", "embedding_plan",
           "embedding_options", "embedding_steps"]

EMBEDDING_SCHEME_NAMES = tuple(s.value for s in (Scheme.REPLICATE, Scheme.FSDP, Scheme.VOCAB, Scheme.ONE_D_COL))
_SPLIT = (Scheme.VOCAB.value, Scheme.ONE_D_COL.value)  # the schemes that take tensor-parallel axes T


class EmbeddingSchemeError(PlannerError, ValueError):
    """An embedding scheme whose options do not fit the table, the tokens or the mesh."""


@dataclass(frozen=True)
class EmbeddingPlan:
    """The layouts of one embedding scheme for one ids shape (see the module docstring)."""

    scheme: str
    ids: Layout       # ids as they arrive and as looked up
    w_store: Layout   # W [V, H] as stored
    w_eff: Layout     # W as the lookup uses it
    y_eff: Layout     # y as looked up (partial over the vocabulary-split axes)
    y_out: Layout     # y as it leaves

    @property
    def vocab_axes(self) -> Axes:
        """Axes splitting the rows the lookup holds (each rank looks up its own range)."""
        return self.w_eff.dims[0]

    @property
    def token_axes(self) -> Axes:
        return self.ids.axes()

    @property
    def weight_extra_axes(self) -> Axes:
        """Axes W is stored over but not used over (gathered in forward, dW reduce-scattered in backward)."""
        return tuple(a for d in range(2) for a in self.w_store.dims[d] if a not in self.w_eff.dims[d])


def _ids_layout(shape: tuple[int, ...], axes: Axes, mesh: Mesh, seq: Axes = ()) -> Layout | None:
    """Tokens split over `axes` (batch first), then `seq` on the last token dim; None when they do not fit."""
    tok = split_tokens(shape, len(shape), axes, mesh)
    if tok is None:
        return None
    lay = Layout(tok[:-1] + (tok[-1] + tuple(seq),))
    return lay if lay.fits(shape, mesh) else None


def _opt(options: dict[str, Any], key: str, default: Any) -> Any:
    v = options.get(key, default)
    return tuple(v) if isinstance(v, list) else v


@lru_cache(maxsize=4096)
def _plan(scheme: str, options: tuple[tuple[str, Any], ...], ids_shape: tuple[int, ...], V: int, H: int,
          mesh: Mesh) -> EmbeddingPlan:
    opts = dict(options)
    T: Axes = tuple(_opt(opts, "T", ()))
    dp: Axes = tuple(_opt(opts, "dp", tuple(a for a in mesh.axis_names if a not in T)))
    if scheme not in EMBEDDING_SCHEME_NAMES:
        raise EmbeddingSchemeError(f"unknown embedding scheme {scheme!r}; choose one of {EMBEDDING_SCHEME_NAMES}")
    if (scheme in _SPLIT) != bool(T):
        need = "one or more" if scheme in _SPLIT else "no"
        raise EmbeddingSchemeError(f"embedding scheme {scheme} takes {need} tensor-parallel axes, got T={T}")
    if len(set(T + dp)) != len(T + dp) or any(a not in mesh.axis_names for a in T + dp):
        raise EmbeddingSchemeError(f"embedding axes T={T} and dp={dp} must be distinct axes of mesh {mesh}")
    if opts.get("sp") and scheme != Scheme.VOCAB:
        raise EmbeddingSchemeError("sp (reduce-scatter onto the sequence dim) applies to the vocab scheme only")
    ids = _ids_layout(ids_shape, dp, mesh)
    if ids is None:
        raise EmbeddingSchemeError(f"{scheme}: tokens {ids_shape} cannot be split over {''.join(dp)} "
                                   f"({mesh.size(dp)} ways, batch first)")
    y = Layout(ids.dims + ((),))
    full = Layout(((), ()))
    if scheme == Scheme.REPLICATE:
        return EmbeddingPlan(scheme, ids, full, full, y, y)
    if scheme == Scheme.FSDP:
        dim = int(opts.get("shard_dim", 0 if V % mesh.size(dp) == 0 else 1))
        if (V, H)[dim] % mesh.size(dp):
            raise EmbeddingSchemeError(f"fsdp: embedding table {(V, H)} dim {dim} not divisible by {mesh.size(dp)}")
        return EmbeddingPlan(scheme, ids, Layout.shard(2, dim, dp), full, y, y)
    label = "".join(T)
    if scheme == Scheme.VOCAB:
        if V % mesh.size(T):
            raise EmbeddingSchemeError(f"vocab[T={label}]: vocabulary {V} not divisible by {mesh.size(T)} "
                                       f"(axis {label})")
        w = Layout.shard(2, 0, T)
        y_out = y
        if opts.get("sp"):
            sp = _ids_layout(ids_shape, dp, mesh, seq=T)
            if sp is None:
                raise EmbeddingSchemeError(f"vocab[T={label},sp]: sequence {ids_shape} not divisible by "
                                           f"{mesh.size(T)}")
            y_out = Layout(sp.dims + ((),))
        return EmbeddingPlan(scheme, ids, w, w, Layout(y.dims, partial=T), y_out)
    if H % mesh.size(T):
        raise EmbeddingSchemeError(f"1d_col[T={label}]: hidden {H} not divisible by {mesh.size(T)} (axis {label})")
    w = Layout.shard(2, 1, T)
    return EmbeddingPlan(scheme, ids, w, w, Layout(ids.dims + (T,)), Layout(ids.dims + (T,)))


def embedding_plan(scheme: str, options: dict[str, Any], ids_shape: Sequence[int], V: int, H: int,
                   mesh: Mesh) -> EmbeddingPlan:
    """The layouts of `scheme` with `options` (T, dp, sp, shard_dim; dp defaults to the axes T leaves) for ids
    of global shape `ids_shape`. Raises EmbeddingSchemeError saying what does not fit."""
    norm = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items() if v is not None))
    return _plan(scheme, norm, tuple(int(s) for s in ids_shape), int(V), int(H), mesh)


def embedding_options(mesh: Mesh, V: int, H: int,
                      subsets: Sequence[Axes] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """The (scheme, options) the planner considers: replicate and fsdp over every axis, replicate with no
    split, and per tensor-parallel axis subset (`subsets`, default every non-empty one) vocab (with and
    without sp) and 1d_col. Options that do not fit a shape are refused by `embedding_plan`."""
    every = mesh.axis_names
    yield Scheme.REPLICATE.value, {"dp": every}
    dim = next((d for d, size in enumerate((V, H)) if size % mesh.world_size == 0), 0)
    yield Scheme.FSDP.value, {"dp": every, "shard_dim": dim}
    yield Scheme.REPLICATE.value, {"dp": ()}
    if subsets is None:
        subsets = [c for r in range(1, len(every) + 1) for c in combinations(every, r)]
    for T in subsets:
        dp = tuple(a for a in every if a not in T)
        yield Scheme.VOCAB.value, {"T": T, "dp": dp, "sp": False}
        yield Scheme.VOCAB.value, {"T": T, "dp": dp, "sp": True}
        yield Scheme.ONE_D_COL.value, {"T": T, "dp": dp}


@dataclass(frozen=True)
class EmbeddingSteps:
    """The redistribution steps of one embedding plan for given global shapes."""

    w_fwd: tuple[Step, ...]       # W_store -> W_eff (tag weight)
    y_fwd: tuple[Step, ...]       # y_eff -> y_out (tag output)
    dy: tuple[Step, ...]          # dY in y_out -> y_eff's layout (tag grad_output)
    dw_scatter: tuple[Step, ...]  # dW in W_eff, partial -> reduce-scattered onto W_store (tag grad_weight)
    dw_reduce: tuple[Step, ...]   # ... then all-reduced over the remaining token axes (tag grad_weight)


@lru_cache(maxsize=4096)
def embedding_steps(plan: EmbeddingPlan, ids_shape: tuple[int, ...], V: int, H: int, w_item: int, y_item: int,
                    mesh: Mesh) -> EmbeddingSteps:
    """Every collective of `plan` (W and y of `w_item` / `y_item` bytes per element) as redistribution steps."""
    y_shape = tuple(ids_shape) + (H,)
    w_fwd = plan_redistribution((V, H), w_item, plan.w_store, plan.w_eff, mesh)
    y_fwd = plan_redistribution(y_shape, y_item, plan.y_eff, plan.y_out, mesh)
    dy = backward_steps(y_fwd, y_shape, y_item, mesh)
    extra = plan.weight_extra_axes
    rest = tuple(a for a in plan.token_axes if a not in extra)
    dw_scatter = plan_redistribution((V, H), w_item, Layout(plan.w_eff.dims, partial=extra), plan.w_store, mesh) \
        if extra else []
    dw_reduce = plan_redistribution((V, H), w_item, Layout(plan.w_store.dims, partial=rest), plan.w_store, mesh) \
        if rest else []
    return EmbeddingSteps(tuple(w_fwd), tuple(y_fwd), tuple(dy), tuple(dw_scatter), tuple(dw_reduce))
