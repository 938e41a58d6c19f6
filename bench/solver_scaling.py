"""Solve time of the flat ILP and the two-level solve as the number of identical blocks grows.

The instance is DESIGN §6's synthetic chain: an embedding-like node, n identical blocks of 8 heavy ops with
10 choices each (random times and bytes drawn once and repeated), random resharding costs on every edge,
a checkpoint flag per block, a head-like node, and the budget at 55 % of the all-fastest assignment's peak.

    python bench/solver_scaling.py                       # 12 24 48 96 blocks, flat limited to 60 s
    python bench/solver_scaling.py --blocks 12 24 --flat-limit 120 --residual

Wall seconds depend on the machine's load; CPU seconds (this process, solver threads included) less so.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]  # this checkout; tests/synthetic_problems

from synthetic_problems import repeated_blocks  # noqa: E402

from planner.search.solve import Problem, Solution, solve  # noqa: E402


def _timed(problem: Problem, method: str, limit: float) -> tuple[Solution, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    sol = solve(problem, method=method, time_limit=limit)
    return sol, time.perf_counter() - wall, time.process_time() - cpu


def _cell(sol: Solution, wall: float, cpu: float) -> str:
    gap = f" gap {sol.gap:.2%}" if sol.status == "feasible" else ""
    return f"{wall:7.1f} s ({cpu:6.1f} cpu) {sol.status}{gap}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[12, 24, 48, 96])
    parser.add_argument("--flat-limit", type=float, default=60.0, help="time limit of the flat ILP (s)")
    parser.add_argument("--skip-flat", action="store_true", help="only run the two-level solve")
    parser.add_argument("--residual", action="store_true", help="DAG blocks (residual edges) instead of chains")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    print(f"{'blocks':>6} | {'flat ILP':<40} | {'two-level':<40} | objective two-level vs flat")
    for n in args.blocks:
        problem = repeated_blocks(np.random.default_rng(args.seed), n_blocks=n, block_nodes=8, choices=10,
                                  residual=args.residual, checkpointing=True, budget_fraction=0.55)
        two, t_wall, t_cpu = _timed(problem, "two_level", 600.0)
        if args.skip_flat:
            flat_cell, versus = "skipped", ""
        else:
            flat, f_wall, f_cpu = _timed(problem, "flat", args.flat_limit)
            flat_cell = _cell(flat, f_wall, f_cpu)
            versus = (f"{(two.objective - flat.objective) / flat.objective:+.2e}"
                      if flat.status in ("optimal", "feasible") and two.status in ("optimal", "feasible") else "")
        print(f"{n:>6} | {flat_cell:<40} | {_cell(two, t_wall, t_cpu):<40} | {versus}", flush=True)


if __name__ == "__main__":
    main()
