"""Measure the peak memory of one training step on this rank, as the cost model defines it.

The quantity (the same one `Plan.predicted.peak_memory_bytes` predicts):

    peak = the largest number of bytes held at once, during one training step (forward, backward and
           optimizer step), by tensor storages: parameters, gradients, optimizer states, the step's inputs
           and every tensor the step creates (activations, saved tensors, gathered buffers, gradients of
           activations, temporaries of the optimizer).

A measured step, `loss = loss_of(model(inputs)); loss.backward(); opt.step()`, follows a first step and
`zero_grad(set_to_none=True)`, so that Adam's moments exist (they are model state the
prediction counts) and gradients are created during the measured backward, as in a training loop.

On CPU `PeakMemoryMeter` counts it: a `TorchDispatchMode` sees every aten op (forward, backward and the
optimizer's), registers the storage of each tensor an op returns with a weakref callback that fires when the
storage is freed, and records the live total after each op. A storage counts once however many tensors view
it, with its full `nbytes`. Tensors that exist before the step (parameters, optimizer states, inputs) are
registered up front (`seed`). Memory no tensor owns (allocator slack, a kernel's internal workspace, a
collective library's staging buffers) is not counted: it is not in the cost model either.

On CUDA the caching allocator's own record gives the same quantity: the peak allocated during the step
minus what was allocated at its start, plus the bytes of the seeded storages.

The step is measured `repeats` times (default 3) and the smallest peak kept. Under load, one rank of
eight sometimes measures 3-29 % above the others (a different rank and test each run, seen with other
jobs running): most likely a gloo worker thread, which drops its reference to a collective's buffers (an
all-gather's chunks, a reduce-scatter's input) only after waking the caller, releasing them a few ops
late. That is thread scheduling, not the program's memory, and it does not repeat step after step.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["PeakMemoryMeter", "step_peak_bytes", "optimizer_tensors"]


class PeakMemoryMeter(TorchDispatchMode):
    """Live bytes of tensor storages while the `with` block runs; `peak` is the largest total seen.

    seed: tensors alive before the block that belong to the measured quantity (parameters, gradients,
    optimizer states, inputs); other pre-existing tensors count only if an op inside the block returns them.
    After the block: `peak` (bytes), `peak_op` (the aten op after which it was reached), `peak_phase` (what
    `phase` said then: the caller names the part of the step it runs), `start` (the seeded bytes) and `live`
    (bytes still held at the end).
    """

    def __init__(self, seed: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._bytes: dict[int, int] = {}      # StorageImpl address -> nbytes
        self._refs: dict[int, weakref.ref] = {}
        self.live = 0
        self.peak = 0
        self.peak_op = ""
        self.phase = ""  # the part of the step running now (set by the caller), kept with the peak
        self.peak_phase = ""
        for t in seed:
            self.track(t)
        self.start = self.peak = self.live

    def track(self, t: object) -> None:
        """Count the storage behind tensor `t` from now until it is freed (once per storage)."""
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        st = t.untyped_storage()
        key, nbytes = st._cdata, st.nbytes()
        if key in self._bytes:
            if nbytes != self._bytes[key]:  # resized in place (an out= op, resize_)
                self.live += nbytes - self._bytes[key]
                self._bytes[key] = nbytes
            return
        self._bytes[key] = nbytes
        self._refs[key] = weakref.ref(st, lambda _ref, k=key: self._freed(k))
        self.live += nbytes

    def _freed(self, key: int) -> None:
        self.live -= self._bytes.pop(key, 0)
        self._refs.pop(key, None)

    def _note(self, what: str) -> None:
        if self.live > self.peak:
            self.peak, self.peak_op, self.peak_phase = self.live, what, self.phase

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            self.track(t)
        for t in pytree.tree_leaves((args, kwargs)):  # in-place and out= ops may resize their arguments
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                key = t.untyped_storage()._cdata
                if key in self._bytes:
                    self.track(t)
        self._note(str(func))
        return out


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in the optimizer's per-parameter state (Adam's moments and step counters)."""
    return [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def step_peak_bytes(model: torch.nn.Module, run_loss: Callable[[], torch.Tensor], opt: torch.optim.Optimizer, *,
                    extra: Iterable[torch.Tensor] = (), repeats: int = 3) -> dict[str, Any]:
    """Peak bytes of one training step of `model` (see the module docstring): runs a first step so the
    optimizer's state exists, then measures the next `repeats` and keeps the smallest peak. `run_loss()`
    runs the forward and returns the loss; `extra` are the step's inputs (counted as held). Mutates the
    parameters (1 + `repeats` optimizer steps).

    Returns {"peak": bytes, "start": bytes held at the start of the measured step, "peak_op": the op at the
    peak and "peak_phase": "forward", "backward" or "optimizer step" (both "" on CUDA)}.
    """
    run_loss().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    gc.collect()
    params = list(model.parameters()) + list(model.buffers())
    seed = params + optimizer_tensors(opt) + list(extra)
    device = next((p.device for p in params if p.device.type == "cuda"), None)
    if device is not None:
        return _cuda_step_peak(run_loss, opt, seed, device)
    best: dict[str, Any] | None = None
    for _ in range(max(1, repeats)):  # the smallest of `repeats` steps (see the module docstring)
        with PeakMemoryMeter(seed) as meter:
            meter.phase = "forward"
            loss = run_loss()
            meter.phase = "backward"
            loss.backward()
            del loss
            meter.phase = "optimizer step"
            opt.step()
        opt.zero_grad(set_to_none=True)
        gc.collect()
        if best is None or meter.peak < best["peak"]:
            best = {"peak": meter.peak, "start": meter.start, "peak_op": meter.peak_op, "peak_phase": meter.peak_phase}
    assert best is not None
    return best


def _cuda_step_peak(run_loss: Callable[[], torch.Tensor], opt: torch.optim.Optimizer, seed: list[torch.Tensor],
                    device: torch.device) -> dict[str, Any]:
    """The same quantity from the CUDA allocator: peak allocated above the start, plus the seeded storages
    (which other allocations on the device, e.g. a dense reference model, do not disturb)."""
    seeded = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in seed}
    start = sum(seeded.values())
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run_loss().backward()
    opt.step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base + start
    opt.zero_grad(set_to_none=True)
    return {"peak": peak, "start": start, "peak_op": "", "peak_phase": ""}
