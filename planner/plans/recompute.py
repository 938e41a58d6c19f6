"""The memory of a checkpointed block's recomputation.

A checkpointed block (non-reentrant `torch.utils.checkpoint`, early stop off: `layers3d.checkpoint`) keeps
only its inputs in the forward. The backward re-runs the block's whole forward when it first unpacks one
of the block's saved tensors: at the backward of the block's last op that saves anything (ops after it, a
residual add at the block's end, are differentiated before, with nothing recomputed yet). While the
forward re-runs, alive beside the step's states and earlier saved activations are: the gradients the
backward holds there (`cost_models.grad_buffers.gradients_alive`), the block's activations recomputed so
far (each storage once; a kept input, or a view of one, saved again is the storage the checkpoint keeps
already), the intermediate outputs a later op of the block still reads, and the working set of the op
re-running: its output and its forward buffers (`OpCost.fwd_extra_bytes`), or the conversion into it.

Measured on HF GPT-2 under 1d with both blocks checkpointed (8 gloo ranks): the step's peak is in the
first block's recomputation, at its last dropout (the CPU kernel's noise, product and scaled output beside
its input, the biased output of the all-reduced MLP projection), with two activation gradients of the
block's output waiting and every recomputed activation alive: 2,066,104 B, where pricing each op's
backward working set beside the activations recomputed up to it gave 1,886,272 B.
"""

from __future__ import annotations

from collections.abc import Iterable

from cost_models.strategies.base import tensor_key
from planner.search.build import BuiltProblem
from planner.trace.graph import ModelGraph

__all__ = ["before_recomputation", "recomputation_peaks"]

# ops whose outputs are views of their input whatever the layout (multi-output splits and their items,
# broadcasting expands, complex views): their outputs make no new storage
_VIEW_KINDS = ("split", "expand", "complex_view")


def before_recomputation(graph: ModelGraph, in_ckpt: dict[str, bool], trigger: dict[str, str]) -> set[str]:
    """The checkpointed ops the backward differentiates before their block's recomputation: those after
    the block's `trigger` op (its last op that saves anything), e.g. a residual add at the block's end and
    the conversion into it. No recomputed activation is alive there."""
    index = {op.name: i for i, op in enumerate(graph.nodes)}
    return {op.name for i, op in enumerate(graph.nodes)
            if in_ckpt[op.name] and (op.block not in trigger or i > index[trigger[op.block]])}


def recomputation_peaks(graph: ModelGraph, built: BuiltProblem, pick: dict[str, int], ckpt: Iterable[str],
                        bases: dict[str, str], saves: dict[str, set[str]], fresh: dict[str, int],
                        unsaved_copies: dict[str, int], conversion_extra: dict[str, int]) -> dict[str, int]:
    """Checkpointed block -> the most bytes its recomputation holds at once beyond what was alive when it
    started (see the module docstring): over its ops in forward order, the activations recomputed before
    the op, the intermediate outputs still to be read, and the op's own: what it saves anew, its output
    (unless it saves that itself or it is a view) and its forward buffers, or the conversion into it.

    bases: `planner.plans.storage.storage_bases`; saves: op -> the storage keys of what it saves;
    fresh: op -> bytes of the storages it is the first to save (kept ones excluded); unsaved_copies: op
    -> bytes of the converted inputs it reads but does not save; conversion_extra: op -> the most the
    conversions into it hold beyond their source."""
    mesh = built.mesh
    nodes = {n.name: n for n in graph.nodes}
    chosen = set(ckpt)
    out: dict[str, int] = {}

    def storage(name: str) -> str:
        while name in nodes and (name in bases or nodes[name].kind in _VIEW_KINDS or (
                nodes[name].kind == "getitem" and nodes[name].inputs
                and len(nodes[nodes[name].inputs[0]].outputs) > 1)):
            name = bases.get(name) or nodes[name].inputs[0]
        return name

    def key_of(name: str) -> str:
        op = nodes[name]
        return tensor_key(name, built.strategies[name][pick[name]].outputs[0]) if op.outputs else name

    def new_bytes(name: str) -> int:
        op, strat = nodes[name], built.strategies[name][pick[name]]
        if storage(name) != name:
            return 0
        return sum(lay.local_numel(m.shape, mesh) * m.itemsize
                   for m, lay in zip(op.outputs, strat.outputs) if lay is not None)

    for b in graph.blocks:
        if b.name not in chosen:
            continue
        ops = [nodes[n] for n in b.nodes]
        first_saver: dict[str, int] = {}
        last_read: dict[str, int] = {}
        for k, op in enumerate(ops):
            for key in saves.get(op.name, ()):
                first_saver.setdefault(key, k)
            for src in op.inputs:
                last_read[storage(src)] = k
        peak = recomputed = 0
        live: dict[str, int] = {}  # storages made in the block, still to be read, not saved yet
        for k, op in enumerate(ops):
            for s in [s for s in live if first_saver.get(key_of(s), k + 1) <= k]:
                del live[s]  # saved by this op: in `fresh` from here on
            mine = new_bytes(op.name)
            own_saved = key_of(op.name) in saves.get(op.name, ())
            cost = built.costs[op.name][pick[op.name]]
            running = recomputed + sum(live.values())
            peak = max(peak,
                       running + fresh.get(op.name, 0) + (0 if own_saved else mine) + cost.fwd_extra_bytes
                       + unsaved_copies.get(op.name, 0),
                       running + conversion_extra.get(op.name, 0))
            recomputed += fresh.get(op.name, 0)
            if mine and not own_saved and last_read.get(op.name, -1) > k \
                    and first_saver.get(key_of(op.name), k + 1) > k:
                live[op.name] = mine
            for s in [s for s in live if last_read.get(s, -1) <= k]:
                del live[s]
        out[b.name] = peak
    return out
