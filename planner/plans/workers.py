"""Plan every candidate mesh shape side by side, in forked worker processes (`plan_meshes`).

Each mesh shape is an independent problem (its own strategies, costs and solve), so `plan()` runs them in
forked worker processes, as many at a time as there are CPUs, biggest first, and picks the best plan in
mesh order (the result does not depend on which worker finishes first). A worker that runs past its hard
deadline is stopped and its mesh skipped. With one CPU or one mesh it all runs in this process.

The meshes share the fastest step time of a plan that fits found so far (`Incumbent`, in memory the forked
workers share): a mesh whose search proves a lower bound above it stops (`solve`'s `beaten`). It could only
have lost to that plan, so the plan returned never depends on which worker finished first; only the work
spent on losing meshes does (LLaMA-3-8B on 64 ranks at 20 GiB: the 4x4x4 mesh, 6 % slower than 8x8, is
stopped in its first round instead of solved three times).
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import time
import traceback
from collections.abc import Callable

from cost_models.mesh import Mesh
from planner.plans.meshes import SOLVES_PER_MESH, MeshResult, beats
from planner.search.solve import Progress

__all__ = ["Incumbent", "WorkerTraceback", "plan_meshes"]

_GRACE_S = 5.0  # past time_limit per solve, before a worker is stopped


class Incumbent:
    """The fastest step time (seconds) of a plan that fits found so far on any mesh, in shared memory that
    forked workers read and lower. `beaten(bound)`: is that plan faster than every plan a mesh whose
    lower bound is `bound` could give (`meshes.beats`)? `found(seconds)`: a mesh's solve found an answer whose
    plan fits, of that step time, before it ends (`plan_mesh`'s `tell`): the mesh's plan is no slower, so the
    other meshes may be stopped by it at once rather than once that mesh is done (HF LLaMA, 64 ranks, 2x its
    smallest budget, two workers: 8x8 stopped 3 s in instead of 8.7 s, CPU 23.8 -> 17.4 s, wall 13.3 -> 12.1 s; the
    4x4x4 mesh, which wins, takes 9.8 s of it alone)."""

    def __init__(self) -> None:
        self._best = mp.get_context("fork").Value("d", float("inf"))

    def offer(self, result: MeshResult) -> None:
        if result.plan is not None:
            self.found(result.objective)

    def found(self, seconds: float) -> None:
        with self._best.get_lock():
            self._best.value = min(self._best.value, seconds)

    def beaten(self, bound: float) -> bool:
        return beats(self._best.value, bound)


def _cost_rank(mesh: Mesh) -> int:
    """Bigger first: more mesh axes mean many more strategies per op."""
    return -len(mesh.shape)


Job = Callable[[Mesh, Incumbent], MeshResult]  # job(mesh, incumbent): see plan_mesh's `beaten` and `tell`


def plan_meshes(meshes: list[Mesh], job: Job, *, time_limit: float | None = None,
                progress: bool = False, workers: int | None = None) -> list[MeshResult]:
    """`job(mesh, incumbent)` for every mesh (the shared `Incumbent`), in forked workers (at most `workers`, default the CPU count), results
    in the order of `meshes`. An exception in a worker is raised here, its worker-side frames attached as
    its cause (`WorkerTraceback`); with a `time_limit`, a worker past its deadline gives an error result
    (without one, every solver limit is a count and workers finish)."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = min(len(meshes), workers)
    incumbent = Incumbent()
    order = sorted(range(len(meshes)), key=lambda i: _cost_rank(meshes[i]))
    if workers <= 1:  # biggest first here too: the smaller meshes' searches then stop once beaten
        with Progress(progress, f"planner: planning {len(meshes)} mesh shape(s)"):
            done = {i: _run(job, meshes[i], incumbent) for i in order}
            return [done[i] for i in range(len(meshes))]
    ctx = mp.get_context("fork")
    deadline_s = (float("inf") if time_limit is None
                  else SOLVES_PER_MESH * (time_limit + _GRACE_S))
    results: dict[int, MeshResult] = {}
    running: dict[int, tuple[mp.Process, object, float]] = {}
    with Progress(progress, f"planner: planning {len(meshes)} mesh shapes in {workers} processes"):
        try:
            while order or running:
                while order and len(running) < workers:
                    i = order.pop(0)
                    running[i] = _start(ctx, job, meshes[i], incumbent) + (time.perf_counter(),)
                for i, (proc, recv, started) in list(running.items()):
                    if recv.poll(0.02):
                        try:
                            kind, value = pickle.loads(recv.recv_bytes())
                        except EOFError:
                            kind, value = "result", MeshResult(meshes[i], error="the planning process died")
                        if kind == "raise":
                            error, frames = value
                            raise error from WorkerTraceback(frames)  # the worker's frames, shown as the cause
                        results[i] = value
                    elif not proc.is_alive() and not recv.poll(0):
                        results[i] = MeshResult(meshes[i], error=f"the planning process died (exit {proc.exitcode})")
                    elif time.perf_counter() - started > deadline_s:
                        results[i] = MeshResult(meshes[i], error=f"no answer within {deadline_s:g} s (stopped)")
                    else:
                        continue
                    _stop(proc, recv)
                    del running[i]
        finally:
            for proc, recv, _ in running.values():
                _stop(proc, recv)
    return [results[i] for i in range(len(meshes))]


def _run(job: Job, mesh: Mesh, incumbent: Incumbent) -> MeshResult:
    result = job(mesh, incumbent)
    incumbent.offer(result)
    return result


def _start(ctx, job: Job, mesh: Mesh, incumbent: Incumbent) -> tuple[mp.Process, object]:
    recv, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            out: tuple[str, object] = ("result", _run(job, mesh, incumbent))
        except BaseException as e:  # raised again in the parent, as it would have been in-process, with its frames
            out = ("raise", (e, f"planning mesh {mesh} in worker process {os.getpid()}:\n{traceback.format_exc()}"))
        try:
            send.send_bytes(pickle.dumps(out))
        except Exception as e:  # an unpicklable exception: send its text
            error, frames = out[1]  # type: ignore[misc]
            send.send_bytes(pickle.dumps(("raise", (RuntimeError(f"{type(error).__name__}: {error} ({e})"), frames))))

    proc = ctx.Process(target=child, daemon=True)
    # The worker inherits this process's heap (the traced graph, the user's model): frozen, the worker's
    # garbage collections skip it and do not touch, and so copy, its pages (LLaMA-3-8B on 64 ranks at
    # 20 GiB, two workers: plan 2.6-2.9 -> 2.2-2.4 s wall).
    gc.freeze()
    try:
        proc.start()
    finally:
        gc.unfreeze()
    send.close()
    return proc, recv


class WorkerTraceback(Exception):
    """The traceback of an exception raised in a planning worker process, as text: set as the `__cause__`
    of the exception raised again in the parent, so a printed traceback shows where it was raised (the
    worker's frames) above the parent's `raise`. (concurrent.futures does the same.)"""

    def __init__(self, frames: str) -> None:
        super().__init__(frames)
        self.frames = frames

    def __str__(self) -> str:
        return "\n" + self.frames.rstrip()


def _stop(proc: mp.Process, recv) -> None:
    if proc.is_alive():
        proc.kill()
    proc.join(timeout=5)
    recv.close()
