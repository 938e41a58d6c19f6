"""Strategies per op and their costs: `enumerate_strategies`, `op_cost`, over the op families' rules.

One rule per op family (one function in `cost_models/strategies/<family>.py`, registered with
`cost_models.family.op_family` together with the family's capture patterns) yields, for an op on a
mesh, each strategy it offers with its hardware-independent `Usage`, and a reason for each variant it
does not offer. Rules are pure functions of (kind, shapes, dtypes, attrs, mesh, input candidates, device
kind), so results are memoised on that key: the 96 identical layers of a GPT are costed once.

    strategies, reasons = enumerate_strategies(op, mesh, input_candidates)
    cost = op_cost(op, strategy, mesh, hw, device="cuda", bytes_per_param=16)

`input_candidates[i]` lists the layouts input i may arrive in (the producers' output layouts; for a
`getitem` of a multi-output op, those of the selected output). Follow ops (element-wise, shape ops,
softmax, matmul of two activations, layer norm, cross-entropy) offer one strategy per usable candidate;
linears and embeddings fix their own input layouts. Hints the rules read from `op.attrs` are set by
`mark_graph_hints` (see `cost_models.strategies.hints`).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Hashable
from functools import cache
from typing import Any

from cost_models.comm import collective_seconds
from cost_models.compute import roofline_seconds
from cost_models.errors import PlannerError
from cost_models.family import family, op_kinds
from cost_models.hardware import HardwareProfile
from cost_models.layout import Layout
from cost_models.memory import DEVICE_KINDS, resolve_bytes_per_param
from cost_models.mesh import Mesh
from cost_models.ops import OpNode, ParamInfo
from cost_models.strategies.base import Candidates, Usage
from cost_models.strategy import OpCost, SavedTensor, Strategy

__all__ = ["registered_kinds", "enumerate_strategies", "op_cost", "op_costs", "op_signature", "StrategyError",
           "mark_graph_hints", "clear_caches"]


class StrategyError(PlannerError, ValueError):
    """An op the cost model cannot handle as asked (no rule for its kind, or a strategy it does not offer)."""


def registered_kinds() -> tuple[str, ...]:
    """The op kinds with a rule: every registered op family."""
    return op_kinds()


# --- canonical ops: the memo key ---------------------------------------------------------------------
def _freeze(v: Any) -> Hashable:
    if isinstance(v, dict) and all(type(x) in _SCALARS for x in v.values()):
        return tuple(sorted(v.items()))  # the common case: a flat dict of scalars
    if isinstance(v, dict):
        return tuple(sorted((str(k), _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, set):
        return tuple(sorted(_freeze(x) for x in v))
    if isinstance(v, slice):
        return ("slice", v.start, v.stop, v.step)
    try:
        hash(v)
    except TypeError:
        return repr(v)
    return v


_SCALARS = (int, float, str, bool, type(None))
_OP = "%op"


def _ref(i: int) -> str:
    return f"%{i}"


# attributes that name where a tensor comes from, not what it is: they do not change strategies or costs
_NAMING_ATTRS = ("buffer", "constant")


def _signature(op: OpNode) -> tuple:
    attrs = {k: v for k, v in op.attrs.items() if k not in _NAMING_ATTRS} if any(
        k in op.attrs for k in _NAMING_ATTRS) else op.attrs
    return (op.kind, op.target, tuple(op.input_meta), tuple(op.outputs),
            tuple((p.shape, p.dtype, p.role) for p in op.params), len(op.inputs), _freeze(attrs))


class _Canon:
    """An op with its names replaced by placeholders; equal for ops that differ only in names. The
    canonical OpNode is built only when a rule has to run (a memo miss)."""

    __slots__ = ("_attrs", "_op", "key", "_hash")

    def __init__(self, op: OpNode) -> None:
        self._attrs = dict(op.attrs)  # a snapshot: later changes to the caller's op do not leak in
        self._op: OpNode | None = None
        self.key = _signature(op)
        self._hash = hash(self.key)

    @property
    def attrs(self) -> dict[str, Any]:
        return self._attrs

    @property
    def op(self) -> OpNode:
        if self._op is None:
            kind, target, input_meta, outputs, params, n_inputs, _ = self.key
            self._op = OpNode(
                name=_OP, kind=kind, target=target, inputs=[_ref(i) for i in range(n_inputs)],
                input_meta=list(input_meta), outputs=list(outputs),
                params=[ParamInfo(f"%p{j}", shape, dtype, role) for j, (shape, dtype, role) in enumerate(params)],
                attrs=self._attrs,
            )
        return self._op

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Canon) and self.key == other.key


def op_signature(op: OpNode) -> Hashable:
    """What an op's strategies and costs depend on (kind, target, shapes, dtypes, params, attrs): ops
    with equal signatures (the same op in identical blocks) have equal strategy lists and costs."""
    return _signature(op)


def _canon(op: OpNode) -> _Canon:
    return _Canon(op)


def _freeze_candidates(c: Candidates) -> Hashable:
    return None if c is None else tuple(tuple(x) if x else () for x in c)


@cache
def _offers(canon: _Canon, mesh: Mesh, cands: Hashable, device: str) -> tuple[dict[Strategy, Usage], tuple[str, ...]]:
    fam = family(canon.op.kind) or family("other")
    assert fam is not None, "the 'other' family is registered in cost_models/strategies/follow.py"
    rule = fam.rule
    candidates = None if cands is None else [list(x) for x in cands]
    table: dict[Strategy, Usage] = {}
    reasons: list[str] = []
    for item in rule(canon.op, mesh, candidates, device):
        if isinstance(item, str):
            if item not in reasons:
                reasons.append(item)
        else:
            strategy, usage = item
            table.setdefault(strategy, usage)
    if not table:
        raise StrategyError(f"no strategy for {canon.op.kind} op on mesh {mesh}: " + "; ".join(reasons))
    return table, tuple(reasons)


def _check_device(device: str) -> None:
    if device not in DEVICE_KINDS:
        raise StrategyError(f"device kind must be one of {DEVICE_KINDS}, got {device!r}")


# The candidates each (op, mesh) was last enumerated with: op_cost looks a strategy up there first.
_LAST_CANDIDATES: dict[tuple[_Canon, Mesh], Hashable] = {}


def enumerate_strategies(op: OpNode, mesh: Mesh,
                         input_candidates: list[list[Layout]] | None = None) -> tuple[list[Strategy], list[str]]:
    """The strategies `op` can run with on `mesh`, and the reasons for the scheme variants not offered
    (e.g. "3d[roles=xyz]: in_features 1600 not divisible by 16 (axis zx)")."""
    canon, cands = _canon(op), _freeze_candidates(input_candidates)
    table, reasons = _offers(canon, mesh, cands, "cuda")
    _LAST_CANDIDATES[(canon, mesh)] = cands
    return list(table), list(reasons)


@cache
def _priced(canon: _Canon, strategy: Strategy, mesh: Mesh, hw: HardwareProfile, device: str, bpp: int) -> OpCost:
    # A strategy's usage depends only on (op, strategy), whichever candidates offered it: look in the
    # enumeration the caller made, then the default one, then one with exactly the strategy's inputs.
    usage = None
    tries = [_LAST_CANDIDATES.get((canon, mesh)), None, tuple((lay,) if lay is not None else () for lay in strategy.inputs)]
    for cands in dict.fromkeys(tries):
        usage = _offers(canon, mesh, cands, device)[0].get(strategy)
        if usage is not None:
            break
    if usage is None:
        raise StrategyError(f"strategy {strategy} is not valid for {canon.op.kind} op with inputs "
                            f"{[m.shape for m in canon.op.input_meta]} on mesh {mesh}")
    fwd = [c for c in usage.collectives if c.phase == "forward"]
    fwd_comm = sum(collective_seconds(c, mesh, hw) for c in fwd)
    comm = fwd_comm + sum(collective_seconds(c, mesh, hw) for c in usage.collectives if c.phase != "forward")
    fwd_compute = roofline_seconds(usage.fwd_flops, usage.fwd_bytes, usage.dtype, hw)
    bwd_compute = roofline_seconds(usage.bwd_flops, usage.bwd_bytes, usage.dtype, hw)
    # An op whose output carries no gradient (hint no_grad) records no autograd node: it saves nothing.
    saved = () if canon.attrs.get("no_grad") else tuple(usage.saved)
    return OpCost(
        param_elems=usage.param_elems, state_bytes=usage.param_elems * bpp + usage.buffer_bytes,
        buffer_bytes=usage.buffer_bytes, saved=saved, largest_param_elems=usage.largest_param_elems,
        transient_bytes=usage.transient_bytes, fwd_extra_bytes=usage.fwd_extra_bytes,
        flops=usage.fwd_flops + usage.bwd_flops,
        fwd_flops=usage.fwd_flops, compute_s=fwd_compute + bwd_compute, fwd_compute_s=fwd_compute,
        collectives=tuple(usage.collectives), comm_s=comm, fwd_comm_s=fwd_comm, notes=tuple(usage.notes),
    )


def _relabel(key: str, op: OpNode) -> str:
    head, sep, rest = key.partition(":")
    if head == _OP:
        return op.name + sep + rest
    if head.startswith("%") and head[1:].isdigit():
        return op.inputs[int(head[1:])] + sep + rest
    return key


def op_cost(op: OpNode, strategy: Strategy, mesh: Mesh, hw: HardwareProfile, *, device: str = "cuda",
            bytes_per_param: int | str = 16) -> OpCost:
    """What `strategy` of `op` costs one rank per training step on `mesh` with hardware `hw`; `device`
    ("cuda" or "cpu") picks the memory semantics (dropout masks), `bytes_per_param` an integer or a
    BYTES_PER_PARAM preset name."""
    return op_costs(op, [strategy], mesh, hw, device=device, bytes_per_param=bytes_per_param)[0]


def op_costs(op: OpNode, strategies: list[Strategy], mesh: Mesh, hw: HardwareProfile, *, device: str = "cuda",
             bytes_per_param: int | str = 16) -> list[OpCost]:
    """`op_cost` of each of `strategies` (the op's signature is computed once: the planner prices every
    strategy of every op, and the signature is most of a memoised lookup's cost)."""
    _check_device(device)
    bpp = resolve_bytes_per_param(bytes_per_param)
    canon = _canon(op)
    out = []
    for strategy in strategies:
        priced = _priced(canon, strategy, mesh, hw, device, bpp)
        saved = tuple(SavedTensor(_relabel(s.key, op), s.bytes) for s in priced.saved)
        out.append(OpCost(
            param_elems=priced.param_elems, state_bytes=priced.state_bytes, buffer_bytes=priced.buffer_bytes,
            saved=saved, largest_param_elems=priced.largest_param_elems,
            transient_bytes=priced.transient_bytes, fwd_extra_bytes=priced.fwd_extra_bytes, flops=priced.flops,
            fwd_flops=priced.fwd_flops,
            compute_s=priced.compute_s, fwd_compute_s=priced.fwd_compute_s, collectives=priced.collectives,
            comm_s=priced.comm_s, fwd_comm_s=priced.fwd_comm_s, notes=priced.notes,
        ))
    return out


def clear_caches() -> None:
    """Forget every memoised enumeration and cost (they are pure, so this only frees memory; a process
    that plans many different models may call it between them)."""
    from cost_models.strategies import base

    _offers.cache_clear()
    _priced.cache_clear()
    _LAST_CANDIDATES.clear()
    base.local_numel.cache_clear()
    base.fits.cache_clear()


# Every module of this package is imported, so a new family file registers itself with no import line.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
from cost_models.strategies.hints import mark_graph_hints  # noqa: E402
