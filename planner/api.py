"""`plan()`: capture -> cost -> solve -> Plan, trying every mesh shape the world size allows."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from cost_models.hardware import HardwareProfile, load_profile
from cost_models.memory import BYTES_PER_PARAM
from cost_models.mesh import Mesh, MeshError, candidate_meshes
from planner.assemble import assemble_plan
from planner.build import BuiltProblem, SchemeError, SchemeUnavailable, build_problem, expand_schemes
from planner.capture import capture
from planner.graph import ModelGraph
from planner.plan_format import Plan
from planner.solve import Solution, solve
from planner.units import parse_bytes

__all__ = ["plan", "InfeasibleError", "WorldSizeError", "resolve_world_size", "resolve_bytes_per_param"]


class InfeasibleError(ValueError):
    """No assignment fits the budget. `min_budget_bytes` is the smallest budget that fits."""

    def __init__(self, message: str, min_budget_bytes: int | None):
        super().__init__(message)
        self.min_budget_bytes = min_budget_bytes


class WorldSizeError(ValueError):
    """A world size that is missing or unusable."""


def resolve_world_size(world_size: int | None) -> int:
    """The explicit world size, else the initialised process group's, else $WORLD_SIZE (torchrun)."""
    if world_size is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size()
        env = os.environ.get("WORLD_SIZE")
        if env is None:
            raise WorldSizeError("world_size is needed: pass world_size=N (or --world-size N), "
                                 "or call plan() inside an initialised torch.distributed process group")
        world_size = int(env) if env.isdigit() else env  # type: ignore[assignment]
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise WorldSizeError(f"world size must be a positive integer, got {world_size!r}")
    return world_size


def resolve_bytes_per_param(value: int | str) -> int:
    if isinstance(value, str):
        if value.isdigit():
            value = int(value)
        elif value in BYTES_PER_PARAM:
            return BYTES_PER_PARAM[value]
        else:
            raise ValueError(f"bytes_per_param {value!r}: use a positive integer or one of "
                             + ", ".join(f"{k} ({v})" for k, v in BYTES_PER_PARAM.items()))
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"bytes_per_param must be a positive integer, got {value!r}")
    return value


# Problems with more edge variables than this are solved in a forked child process that is stopped at a
# hard deadline (time_limit plus a grace period): the two-level solve's frontier stage is not bounded by
# the ILP time limit, and one slow mesh shape must not hold up a plan the other shapes already give.
_ISOLATE_EDGE_VARS = 20_000
_GRACE_S = 5.0


def _solve_within(problem, *, solver: str, time_limit: float, progress: bool) -> Solution:
    size = sum(e.cost_s.size for e in problem.edges)
    if size <= _ISOLATE_EDGE_VARS:
        return solve(problem, solver=solver, time_limit=time_limit, progress=progress)
    import multiprocessing as mp
    import pickle

    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            out = solve(problem, solver=solver, time_limit=time_limit, progress=False)
        except Exception as e:  # reported to the parent as an error status
            out = Solution(status="error", message=f"{type(e).__name__}: {e}")
        send.send_bytes(pickle.dumps(out))

    proc = ctx.Process(target=child, daemon=True)
    start = time.perf_counter()
    proc.start()
    send.close()
    try:
        if recv.poll(time_limit + _GRACE_S):
            return pickle.loads(recv.recv_bytes())
        return Solution(status="error", seconds=time.perf_counter() - start, solver=solver,
                        message=f"no answer within time_limit={time_limit:g} s (stopped); raise time_limit")
    except EOFError:
        return Solution(status="error", solver=solver, message="the solver process died")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=5)
        recv.close()


_FIT_ROUNDS = 4


def _fit(built: BuiltProblem, assemble, budget: int, *, solver: str, time_limit: float, progress: bool
         ) -> tuple[tuple[Solution, Plan] | None, int | None]:
    """Solve one mesh's problem and keep the answer only if the assembled plan fits `budget`.

    The plan's accounting (`assemble_plan`) is the reference: it adds working sets the per-choice problem
    cannot see (a layout conversion's staging buffers, which depend on both ends' choices, and the
    recomputed activations alive beside an op in a checkpointed block's backward). When it exceeds the
    budget, the solver's budget is tightened by the excess and the problem solved again. Returns
    ((solution, plan) or None, the least peak found when nothing fits (a budget that does fit))."""
    problem = built.problem
    cap = budget
    least: int | None = None
    seconds = 0.0
    try:
        for _ in range(_FIT_ROUNDS):
            problem.budget_bytes = cap
            sol = _solve_within(problem, solver=solver, time_limit=time_limit, progress=progress)
            seconds += sol.seconds
            sol.seconds = seconds
            if sol.status in ("optimal", "feasible"):
                p = assemble(built, sol)
                if p.predicted.peak_memory_bytes <= budget:
                    return (sol, p), None
                cap -= max(p.predicted.peak_memory_bytes - budget, 1)
                if cap <= 0:
                    break
                continue
            break
        if sol.status in ("optimal", "feasible") or (sol.status == "infeasible" and cap != budget):
            # the least-memory search of a tightened budget may differ from an untightened one's: ask
            # the budget-independent question, so the budget reported here is one that re-planning meets
            problem.budget_bytes = 0
            sol = _solve_within(problem, solver=solver, time_limit=time_limit, progress=progress)
        if sol.status == "infeasible" and sol.choice:
            # the least-memory assignment: its exact peak is a budget that fits
            sol.status, sol.message = "feasible", "the least-memory assignment (tighter budgets found none)"
            p = assemble(built, sol)
            if p.predicted.peak_memory_bytes <= budget:
                return (sol, p), None
            least = p.predicted.peak_memory_bytes
        elif sol.status == "infeasible" and sol.min_feasible_budget is not None:
            least = sol.min_feasible_budget
    finally:
        problem.budget_bytes = budget
    return None, least


def plan(model: nn.Module | ModelGraph, budget: int | str, *, world_size: int | None = None,
         example_inputs: Sequence[Any] | None = None, input_shapes: Sequence[Any] | None = None,
         hardware: str | HardwareProfile = "a100-80gb", schemes: Sequence[str] | str | None = None,
         checkpointing: bool = True, bytes_per_param: int | str = 16, solver: str = "highs",
         time_limit: float = 60.0, device: str | None = None, meshes: Sequence[Mesh] | None = None,
         name: str | None = None, progress: bool = False) -> Plan:
    """Plan `model` for `world_size` ranks under a per-rank memory `budget`.

    budget: bytes, or a string such as "16GiB" / "80GB".
    hardware: a built-in profile name ("a100-80gb", "h100-80gb", "cpu-gloo") or a profile JSON path.
    schemes: restrict the heavy ops to these schemes ("1d" covers 1d_col and 1d_row); ops that have none
        of them (embeddings, the loss) keep their own strategies.
    checkpointing: let the solver checkpoint repeated blocks.
    bytes_per_param: model-state bytes per parameter (16 fp32 Adam, 18 bf16 mixed precision, 2 inference)
        or a preset name.
    device: "cuda" or "cpu" semantics for saved activations (default: the hardware profile's).
    meshes: the mesh shapes to try (default: every shape `candidate_meshes` allows).
    Raises InfeasibleError (with the smallest feasible budget) when nothing fits.
    """
    budget_bytes = parse_bytes(budget)
    n = resolve_world_size(world_size)
    bpp = resolve_bytes_per_param(bytes_per_param)
    hw = hardware if isinstance(hardware, HardwareProfile) else load_profile(hardware)
    kind = device or hw.device
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {kind!r}")
    allowed = expand_schemes(schemes)
    t0 = time.perf_counter()
    graph = model if isinstance(model, ModelGraph) else capture(model, example_inputs, input_shapes=input_shapes,
                                                                name=name)
    t_capture = time.perf_counter() - t0
    mesh_list = list(meshes) if meshes is not None else candidate_meshes(n, hw.gpus_per_node)
    for m in mesh_list:
        if m.world_size != n:
            raise MeshError(f"mesh {m} has {m.world_size} ranks but world_size is {n}")

    unavailable: list[str] = []
    best: tuple[BuiltProblem, Solution, Plan] | None = None
    min_budget: int | None = None

    def assemble(built: BuiltProblem, sol: Solution) -> Plan:
        return assemble_plan(graph, built, sol, hw, budget_bytes=budget_bytes, device=kind, bytes_per_param=bpp,
                             checkpointing=checkpointing, schemes=sorted(allowed) if allowed else None,
                             seconds={"capture": t_capture, "total": time.perf_counter() - t0})

    for m in mesh_list:
        try:
            built = build_problem(graph, m, hw, budget_bytes, device=kind, bytes_per_param=bpp, schemes=allowed,
                                  checkpointing=checkpointing)
        except SchemeUnavailable as e:
            unavailable.append(f"mesh {m}: {e}")
            continue
        found, least = _fit(built, assemble, budget_bytes, solver=solver, time_limit=time_limit, progress=progress)
        if found is not None:
            sol, p = found
            if best is None or sol.objective < best[1].objective - 1e-15:
                best = (built, sol, p)
        elif least is not None:
            min_budget = least if min_budget is None else min(min_budget, least)
    if best is None and len(unavailable) == len(mesh_list):
        raise SchemeError(f"schemes {sorted(allowed or [])} cannot run {graph.name} on {n} ranks: "
                          + "; ".join(unavailable) + ". Allow more schemes or pick another world size")
    if best is None:
        from planner.units import format_bytes

        hint = f"; the smallest budget that fits is {format_bytes(min_budget)} ({min_budget} bytes)" \
            if min_budget is not None else ""
        raise InfeasibleError(f"no plan for {graph.name} on {n} ranks fits {format_bytes(budget_bytes)} per rank"
                              + hint, min_budget)
    return best[2]
