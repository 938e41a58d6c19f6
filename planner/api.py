"""`plan()`: capture -> cost -> solve -> Plan, trying every mesh shape the world size allows."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from cost_models.errors import PlannerError, PlannerWarning
from cost_models.hardware import HardwareProfile, load_profile
from cost_models.memory import BYTES_PER_PARAM, MemoryModelError
from cost_models.mesh import Mesh, MeshError, candidate_meshes, check_world_size
from cost_models.optimizer import resolve_optimizer
from planner.apply.applicable import check_applicable
from planner.plans.assemble import assemble_plan
from planner.plans.format import INPUT_MODES, Plan
from planner.plans.meshes import MeshResult, narrow_least, plan_mesh, room_to_use, use_room
from planner.plans.workers import Incumbent, plan_meshes
from planner.search.build import BuiltProblem, SchemeError, build_problem, expand_schemes
from planner.search.solve import Solution, SolverError
from planner.trace.graph import ModelGraph
from planner.trace.tracer import capture
from planner.units import parse_bytes

__all__ = ["plan", "InfeasibleError", "WorldSizeError", "resolve_world_size", "resolve_bytes_per_param",
           "warn_about_coverage"]


class InfeasibleError(PlannerError, ValueError):
    """No assignment fits the budget. `min_budget_bytes` is the smallest budget that fits."""

    exit_code = 3

    def __init__(self, message: str, min_budget_bytes: int | None):
        super().__init__(message)
        self.min_budget_bytes = min_budget_bytes


class WorldSizeError(PlannerError, ValueError):
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
    try:
        return check_world_size(world_size)
    except MeshError as e:
        raise WorldSizeError(str(e)) from None


def warn_about_coverage(graph: ModelGraph) -> None:
    """Warn (PlannerWarning) when the traced model is not a whole training step as the user likely meant it:
    a floating input of another dtype than the parameters (the real run fails or converts it), or no scalar
    output (no loss: the loss and its memory are not in the plan)."""
    param_dtypes = {p.dtype for op in graph.nodes for p in op.params if p.dtype.startswith(("float", "bfloat"))}
    for op in graph.nodes:
        if op.kind == "input" and op.out.dtype.startswith(("float", "bfloat")) and param_dtypes \
                and op.out.dtype not in param_dtypes:
            warnings.warn(f"input {op.name!r} is {op.out.dtype} but the parameters of {graph.name} are "
                          f"{', '.join(sorted(param_dtypes))}: the model will fail or convert it when it runs, and "
                          "the plan prices it as given; pass inputs of the parameters' dtype",
                          PlannerWarning, stacklevel=3)
    outputs = [m for op in graph.nodes if op.kind == "output" for m in op.input_meta]
    if outputs and not any(m.shape == () and m.dtype.startswith(("float", "bfloat")) for m in outputs):
        shown = ", ".join(f"{list(m.shape)} {m.dtype}" for m in outputs[:3])
        warnings.warn(f"{graph.name} returns no loss (no scalar output; it returns {shown}): the plan prices its "
                      "forward and a backward from these outputs, but not the loss a training step computes from "
                      "them; make forward return the loss (e.g. pass targets) to plan a whole step",
                      PlannerWarning, stacklevel=3)


def resolve_bytes_per_param(value: int | str) -> int:
    if isinstance(value, str):
        if value.isdigit():
            value = int(value)
        elif value in BYTES_PER_PARAM:
            return BYTES_PER_PARAM[value]
        else:
            raise MemoryModelError(f"bytes_per_param {value!r}: use a positive integer or one of "
                             + ", ".join(f"{k} ({v})" for k, v in BYTES_PER_PARAM.items()))
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MemoryModelError(f"bytes_per_param must be a positive integer, got {value!r}")
    return value


def _as_mesh(m: Mesh | Sequence[int] | str) -> Mesh:
    """A mesh given as a `Mesh`, a shape tuple or a string such as "2x2x2"."""
    if isinstance(m, Mesh):
        return m
    if isinstance(m, str) and re.fullmatch(r"\s*\d+(\s*x\s*\d+)*\s*", m):
        return Mesh(tuple(int(d) for d in m.split("x")))
    if isinstance(m, (tuple, list)) and m and all(isinstance(d, int) and not isinstance(d, bool) for d in m):
        return Mesh(tuple(m))
    raise MeshError(f"meshes: {m!r} is not a mesh shape; give Mesh((2, 4)), a tuple of ints (2, 4) or a "
                    "string '2x4'")


def _fastest(results: list[MeshResult]) -> MeshResult | None:
    """The result with the fastest plan, in mesh order (ties keep the first); None when no mesh has one."""
    best: MeshResult | None = None
    for r in results:
        if r.plan is not None and (best is None or r.objective < best.objective - 1e-15):
            best = r
    return best


def plan(model: nn.Module | ModelGraph, budget: int | str, *, world_size: int | None = None,
         example_inputs: Sequence[Any] | None = None, input_shapes: Sequence[Any] | None = None,
         hardware: str | HardwareProfile = "a100-80gb", schemes: Sequence[str] | str | None = None,
         checkpointing: bool = True, bytes_per_param: int | str = 16, solver: str = "highs",
         time_limit: float | None = None, device: str | None = None, meshes: Sequence[Mesh] | None = None,
         name: str | None = None, progress: bool = False, workers: int | None = None, inputs: str = "full",
         optimizer: str | None = None, prove: bool = False) -> Plan:
    """Plan `model` for `world_size` ranks under a per-rank memory `budget`.

    budget: bytes, or a string such as "16GiB" / "80GB".
    hardware: a built-in profile name ("a100-80gb", "h100-80gb", "cpu-gloo") or a profile JSON path.
    schemes: restrict the heavy ops to these schemes ("1d" covers 1d_col and 1d_row); ops that have none
        of them (embeddings, the loss) keep their own strategies.
    checkpointing: let the solver checkpoint repeated blocks.
    bytes_per_param: model-state bytes per parameter (16 fp32 Adam, 18 bf16 mixed precision, 2 inference)
        or a preset name.
    device: "cuda" or "cpu" semantics for saved activations (default: the hardware profile's).
    meshes: the mesh shapes to try, each a `Mesh`, a shape tuple such as (2, 4) or a string such as "2x4"
        (default: every shape `candidate_meshes` allows).
    workers: processes that plan mesh shapes in parallel (default: the CPU count; 1 plans in this process).
    inputs: how the trained model will be called (`apply_plan` runs the plan so): "full" (every rank passes
        the whole batch and gets whole outputs back, e.g. a language model's logits gathered on every rank)
        or "sharded" (each rank passes and gets its block of the batch: a data loader per rank, as real
        training runs). The memory model prices the conversion of the outputs to that layout.
    optimizer: the torch AdamW implementation the training step runs, whose temporaries the optimizer step
        holds beside every state: "single_tensor", "foreach" or "fused" (default: torch's for the device,
        foreach on CUDA and single_tensor on CPU). Build it with `optimizer_kwargs(plan.options.optimizer)`.
    time_limit: None (default): every solver limit is counted in work, so the plan is a function of (model,
        budget, mesh, hardware, options) and the same on a busy machine as on a quiet one. Seconds: each
        solve may also stop there; the plan's `solver` block then says so (status "feasible", message).
    prove: where a plan is not proven optimal (the priced search's gap), look for the optimum with the exact
        flat ILP over the options that can beat it (`planner.search.solve.fixing`; problems of at most four
        repeated blocks) without the work limit it runs with by default: status "optimal" where that proves
        it. Where it is proven for the solver's memory formulas only (the message says so: they count some
        assignments above the plan's accounting), prove it as the plan counts (the flat ILP counting the held
        rows), or find the faster plan that fits and its gap. Seconds to a minute more on the tiny 2-layer models.
    Raises InfeasibleError (with the smallest feasible budget) when nothing fits, and
    `planner.apply.applicable.NotApplicableError` when the best plan is one `apply_plan` could not build
    (checked on meta tensors when `model` is a module; a ModelGraph has no parameters to check with).
    """
    budget_bytes = parse_bytes(budget)
    if inputs not in INPUT_MODES:
        raise PlannerError(f"inputs={inputs!r}: use 'full' (whole batch in and whole outputs out on every rank) or "
                        "'sharded' (each rank its block of the batch)")
    n = resolve_world_size(world_size)
    bpp = resolve_bytes_per_param(bytes_per_param)
    hw = hardware if isinstance(hardware, HardwareProfile) else load_profile(hardware)
    kind = device or hw.device
    if kind not in ("cuda", "cpu"):
        raise MemoryModelError(f"device must be 'cuda' or 'cpu', got {kind!r}")
    optimizer = resolve_optimizer(optimizer, kind)
    allowed = expand_schemes(schemes)
    graph = model if isinstance(model, ModelGraph) else capture(model, example_inputs, input_shapes=input_shapes,
                                                                name=name)
    warn_about_coverage(graph)
    mesh_list = [_as_mesh(m) for m in meshes] if meshes is not None else candidate_meshes(n, hw.gpus_per_node)
    for m in mesh_list:
        if m.world_size != n:
            raise MeshError(f"mesh {m} has {m.world_size} ranks but world_size is {n}")

    def assemble(built: BuiltProblem, sol: Solution) -> Plan:
        return assemble_plan(graph, built, sol, hw, budget_bytes=budget_bytes, device=kind, bytes_per_param=bpp,
                             checkpointing=checkpointing, schemes=sorted(allowed) if allowed else None,
                             input_mode=inputs, optimizer=optimizer)

    built: dict[Mesh, BuiltProblem] = {}  # meshes built in this process: `narrow_least` and `use_room` plan
    # some of them again (a built problem is the same for every budget; GPT-3 175B's 4x4x4 takes 1.2 s)

    def build(m: Mesh) -> BuiltProblem:
        if m not in built:
            built[m] = build_problem(graph, m, hw, budget_bytes, device=kind, bytes_per_param=bpp, schemes=allowed,
                                     checkpointing=checkpointing, input_mode=inputs, optimizer=optimizer)
        return built[m]

    def first(m: Mesh, incumbent: Incumbent) -> MeshResult:
        out = plan_mesh(m, build, assemble, budget_bytes, solver=solver, time_limit=time_limit,
                        beaten=incumbent.beaten, tell=incumbent.found, prove=prove)
        if m in built and room_to_use(out, budget_bytes, prove, len(graph.blocks)) is not None:
            # `use_room` may plan this mesh again in this process: from a worker process, its problem comes back
            # with its result (`narrow_least` runs in workers again, where building costs no more than sending:
            # GPT-3 175B's 4x4x4 problem is 66 MB, 1.5 s to pickle and load)
            out.built = built[m]
        return out

    results = plan_meshes(mesh_list, first, time_limit=time_limit, progress=progress, workers=workers)
    for r in results:
        if r.built is not None:
            built.setdefault(r.mesh, r.built)
            r.built = None
    unavailable = [f"mesh {r.mesh}: {r.unavailable}" for r in results if r.unavailable]
    best = _fastest(results)
    # No plan anywhere: look below the least-memory plans' bounds, on the meshes whose solver's least peak
    # is below the smallest budget found: the others' plans would take more than it by the solver's count
    # (HF GPT-2 on 64 ranks: 4x4x4's 413,988 B leaves (64,) and 8x8 unnarrowed, whose least-memory answers
    # the solver counts at 708,416 and 643,904 B; the smallest-budget search 15.8 -> 5.1 s), each below the
    # smallest found, not its own (gpt-tiny on 8 ranks: 13.2 -> 8.9 s CPU, the same smallest budget)
    smallest = min((r.least for r in results if r.least is not None), default=None)
    narrow = {r.mesh: r for r in results if r.narrow and r.least_peak < smallest}
    if best is None and narrow:
        narrowed = plan_meshes(list(narrow), lambda m, _: narrow_least(m, build, assemble, budget_bytes, narrow[m].least,
                                                                       target=smallest, least_peak=narrow[m].least_peak,
                                                                       solver=solver, time_limit=time_limit),
                               time_limit=time_limit, progress=progress, workers=workers)
        by_mesh = {r.mesh: r for r in narrowed}
        results = [by_mesh.get(r.mesh, r) for r in results]
        best = _fastest(results)
    if best is not None:
        def again(m: Mesh, room: int, known: Solution, beaten: Callable[[float], bool], apart: bool) -> MeshResult:
            return plan_mesh(m, build, assemble, budget_bytes, solver=solver, time_limit=time_limit, loosen=room,
                             prove=prove, known=known, beaten=beaten, apart=apart)

        best = use_room(best, budget_bytes, again, proven_too=prove, blocks=len(graph.blocks))
    leasts = [r.least for r in results if r.least is not None]
    min_budget = min(leasts) if leasts else None
    errors = [f"mesh {r.mesh}: {r.error}" for r in results if r.error]
    if best is None and len(unavailable) == len(mesh_list):
        raise SchemeError(f"schemes {sorted(allowed or [])} cannot run {graph.name} on {n} ranks: "
                          + "; ".join(unavailable) + ". Allow more schemes or pick another world size")
    if best is None:
        from planner.units import format_bytes

        hint = f"; the smallest budget that fits is {format_bytes(min_budget)} ({min_budget} bytes)" \
            if min_budget is not None else ""
        if min_budget is None and errors:
            raise SolverError(f"no plan for {graph.name} on {n} ranks: " + "; ".join(errors))
        whole = sum(m.nbytes for op in graph.nodes if op.kind == "output" for m in op.input_meta if m.shape)
        if inputs == "full" and min_budget is not None and whole > min_budget // 10:
            hint += (f"; with inputs='full' every rank also holds the outputs whole ({format_bytes(whole)}): "
                     "inputs='sharded' (CLI --inputs sharded) leaves each rank its block of the batch")
        raise InfeasibleError(f"no plan for {graph.name} on {n} ranks fits {format_bytes(budget_bytes)} per rank"
                              + hint, min_budget)
    if isinstance(model, nn.Module):  # what the plan says must be what runs: build it as apply_plan would
        check_applicable(model, graph, best.plan)
    return best.plan
