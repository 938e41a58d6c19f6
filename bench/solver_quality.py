"""Solver quality and speed at tight budgets: plan time, the reported gap, and the exact flat ILP's optimum.

    python bench/solver_quality.py                                   # every model, 8 and 64 ranks
    python bench/solver_quality.py --model hf-mistral --ranks 8 --flat-cap 600
    python bench/solver_quality.py --llama                           # LLaMA-3-8B shape on 64 ranks
    python bench/solver_quality.py --prove --model hf-llama --ranks 8  # each plan, then with prove=True

Per model and world size: the smallest budget the planner reports (planning at 1 byte, timed: the
smallest-budget search), then five budgets from it to 4x it. Per budget: `plan()` seconds (capture
excluded), the plan's solver status ("optimal (formulas)" where proven for the solver's memory formulas only, not
against the plan's accounting: `planner.search.solve.problem.FORMULAS_ONLY`) and gap (to the solver's proven lower
bound), and, on the plan's mesh,
the priced/auto solve's objective next to the exact flat ILP's (without its work limit, started from the
auto answer, given `--flat-cap` seconds; "-" when it did not prove its optimum in time). Models: the built-in examples and tiny HF configs
(`bench/hf_tiny.py`: Llama, Mistral, Qwen2, GPT-NeoX, OPT, BERT; 2 layers, hidden 64, vocab 512, batch
8 x 32). `--llama`: LLaMA-3-8B on the meta device (bf16, batch 64 x 2048) on 64 ranks at 20/40/80 GiB (default hardware and bytes per parameter, inputs="sharded"),
capture and plan timed apart, then `plan(model, ...)` end to end with the default worker processes. `--prove`:
per budget, the plan and the plan with `prove=True` side by side (the exact flat ILP over the options that can
beat the answer, `planner.search.solve.fixing`), CPU seconds in one process. `--workers 2`: the meshes planned in
two worker processes, as `plan()` does by default (wall seconds as a user sees them). Timings depend on the
machine's load; plans and gaps do not (every solver limit is counted in work).
"""

from __future__ import annotations

import argparse
import functools
import math
import resource
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # hf_tiny; this checkout

from hf_tiny import HF_TINY, bench_graph, llama3_8b_meta  # noqa: E402

from cost_models.hardware import load_profile  # noqa: E402
from planner import InfeasibleError, plan  # noqa: E402
from planner.search.build import build_problem  # noqa: E402
from planner.search.solve import solve  # noqa: E402
from planner.search.solve.driver import solve_built  # noqa: E402
from planner.search.solve.ilp import build_flat  # noqa: E402
from planner.search.solve.indexed import IndexedProblem, fold_fixed_edges, fold_shared_inputs  # noqa: E402
from planner.search.solve.problem import FORMULAS_ONLY  # noqa: E402
from planner.trace.tracer import capture  # noqa: E402
from planner.units import format_bytes  # noqa: E402

BUILTIN = ["mlp", "gpt-tiny", "hf-gpt2", "gpt2-small", "gpt2-xl", "gpt3-175b"]
FACTORS = (1.0, 1.25, 1.5, 2.0, 4.0)
HARDWARE = "a100-80gb"
WORKERS = 1


def _cpu() -> float:
    """CPU seconds of this process and of its children that ended (the planning workers, with `--workers` > 1)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _timed(fn, *args, **kwargs):
    """fn(*args, **kwargs)'s result (or the InfeasibleError it raised), wall seconds and CPU seconds (with workers=1,
    the default here, every mesh is planned in this process: on a loaded machine CPU seconds are the fairer figure;
    `--workers 2` times plans as `plan()` runs them by default, meshes in two worker processes)."""
    wall, cpu = time.perf_counter(), _cpu()
    try:
        out = fn(*args, **kwargs)
    except InfeasibleError as e:
        out = e
    return out, time.perf_counter() - wall, _cpu() - cpu


def _smallest(graph, world: int) -> tuple[int | None, float, float]:
    out, wall, cpu = _timed(plan, graph, 1, world_size=world, hardware=HARDWARE, workers=WORKERS)
    need = out.min_budget_bytes if isinstance(out, InfeasibleError) else out.predicted.bound_bytes
    return need, wall, cpu


def _flat(graph, mesh, budget: int, cap: float) -> tuple[float | None, float | None, float]:
    """(auto objective, flat optimum or None, flat seconds) of the solver's problem on `mesh`: the exact flat
    ILP with no work limit, only `cap` seconds, started from the auto answer (a start changes how soon it
    finishes, never the optimum it proves)."""
    hw = load_profile(HARDWARE)
    built = build_problem(graph, mesh, hw, budget, device=hw.device, bytes_per_param=16, schemes=None)
    auto = solve(built.problem)
    found = auto.status in ("optimal", "feasible")
    if cap <= 0 or not found:
        return (auto.objective if found else None), None, 0.0
    ip = IndexedProblem(built.problem, budget)
    fold_fixed_edges(ip)
    fold_shared_inputs(ip)
    start = time.perf_counter()
    flat = solve_built(ip, functools.partial(build_flat, ip), solver="highs", deadline=start + cap, method="flat",
                       initial=ip.vectors(auto.choice, auto.checkpointed),
                       work_limit=None)
    best = flat.objective if flat.status == "optimal" else None
    return auto.objective, best, time.perf_counter() - start


def _status(p) -> str:
    """The plan's solver status, "optimal (formulas)" where proven for the solver's memory formulas only
    (`FORMULAS_ONLY`: not against the plan's accounting, which may fit a faster plan)."""
    s = p.solver
    return f"{s.status} (formulas)" if s.status == "optimal" and FORMULAS_ONLY in s.message else s.status


def quality(names: list[str], ranks: list[int], flat_cap: float) -> None:
    print("| model | ranks | budget | plan s wall / cpu | mesh | plan step | status | gap | auto objective "
          "| flat optimum (s) |")
    print("|---|---:|---:|---:|---|---:|---|---:|---:|---:|")
    for name in names:
        graph = bench_graph(name)
        for world in ranks:
            need, wall, cpu = _smallest(graph, world)
            print(f"| {name} | {world} | smallest {format_bytes(need) if need else '-'} | {wall:.1f} / {cpu:.1f} "
                  "| | | | | | |", flush=True)
            if need is None:
                continue
            for f in FACTORS:
                budget = int(math.ceil(need * f))
                p, wall, cpu = _timed(plan, graph, budget, world_size=world, hardware=HARDWARE, workers=WORKERS)
                if isinstance(p, InfeasibleError):
                    print(f"| {name} | {world} | {format_bytes(budget)} | {wall:.1f} / {cpu:.1f} | | | infeasible "
                          "| | | |", flush=True)
                    continue
                s = p.solver
                gap = "-" if s.gap is None else f"{s.gap:.2%}"
                auto, best, fsecs = _flat(graph, p.mesh, budget, flat_cap)
                ref = "-" if best is None else f"{best * 1e3:.4f} ms ({fsecs:.0f} s)"
                print(f"| {name} | {world} | {format_bytes(budget)} | {wall:.1f} / {cpu:.1f} | {p.mesh} "
                      f"| {p.predicted.step_time_s * 1e3:.4f} ms | {_status(p)} | {gap} | "
                      f"{'-' if auto is None else f'{auto * 1e3:.4f} ms'} | {ref} |", flush=True)


def proving(names: list[str], ranks: list[int]) -> None:
    print("| model | ranks | budget | plan: s cpu, step, status, gap | prove=True: s cpu, step, status, gap |")
    print("|---|---:|---:|---|---|")
    for name in names:
        graph = bench_graph(name)
        for world in ranks:
            need = _smallest(graph, world)[0]
            for f in FACTORS if need is not None else ():
                budget = int(math.ceil(need * f))
                cells = []
                for prove in (False, True):
                    p, _, cpu = _timed(plan, graph, budget, world_size=world, hardware=HARDWARE, workers=WORKERS,
                                       prove=prove)
                    cells.append("infeasible" if isinstance(p, InfeasibleError) else
                                 f"{cpu:.1f} s, {p.predicted.step_time_s * 1e3:.4f} ms, {_status(p)}, "
                                 f"{'-' if p.solver.gap is None else f'{p.solver.gap:.2%}'}")
                print(f"| {name} | {world} | {f:g}x {format_bytes(budget)} | {cells[0]} | {cells[1]} |", flush=True)


def llama(budgets: list[str]) -> None:
    print("| LLaMA-3-8B, 64 ranks | capture s wall / cpu | plan s wall / cpu | status | gap | step ms "
          "| `plan(model)` s wall, default workers |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for b in budgets:
        model, inputs = llama3_8b_meta()
        graph, cwall, ccpu = _timed(capture, model, inputs, name="llama3-8b")
        p, wall, cpu = _timed(plan, graph, b, world_size=64, workers=WORKERS, inputs="sharded")
        gap = "-" if p.solver.gap is None else f"{p.solver.gap:.2%}"
        # what a user calls: capture and plan in one call, meshes planned by the default worker processes
        model, inputs = llama3_8b_meta()
        whole, whole_wall, _ = _timed(plan, model, b, example_inputs=inputs, world_size=64, inputs="sharded")
        assert whole.predicted.step_time_s == p.predicted.step_time_s, "one process and workers disagree"
        print(f"| {b} | {cwall:.1f} / {ccpu:.1f} | {wall:.1f} / {cpu:.1f} | {_status(p)} | {gap} | "
              f"{p.predicted.step_time_s * 1e3:.1f} | {whole_wall:.1f} |", flush=True)


def main() -> None:
    global WORKERS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help=f"models (default: {', '.join(BUILTIN + list(HF_TINY))})")
    ap.add_argument("--ranks", type=int, action="append", help="world sizes (default: 8 and 64)")
    ap.add_argument("--flat-cap", type=float, default=600.0, help="seconds for the flat ILP reference (0: skip)")
    ap.add_argument("--llama", action="store_true", help="the LLaMA-3-8B shape on 64 ranks instead")
    ap.add_argument("--llama-budgets", default="20GiB,40GiB,80GiB")
    ap.add_argument("--prove", action="store_true", help="each plan beside the plan with prove=True")
    ap.add_argument("--workers", type=int, default=WORKERS,
                    help="planning worker processes (default 1: every mesh in this process; plan()'s default is 2)")
    args = ap.parse_args()
    WORKERS = args.workers
    if args.llama:
        llama(args.llama_budgets.split(","))
        return
    if args.prove:
        proving(args.model or BUILTIN + list(HF_TINY), args.ranks or [8, 64])
        return
    quality(args.model or BUILTIN + list(HF_TINY), args.ranks or [8, 64], args.flat_cap)


if __name__ == "__main__":
    main()
