"""How far the solver's memory formulas are from the plan's accounting, on the answers `solve` produces.

    python bench/account_slack.py                        # hf-bert, hf-gpt2, hf-llama, gpt-tiny on 8 ranks
    python bench/account_slack.py --models hf-bert --factors 1,2

`plan()` checks every answer of the solver with the assembled plan's bound (`solve`'s account): an answer
the formulas let through but the plan counts over the budget is solved again tighter (a whole re-solve),
and where the formulas count more than the plan, room is left unused. Per model and budget (multiples of
the smallest budget the planner reports), every answer the account measured, in order: its mesh, the
formulas' peak, the plan's bound, their difference as a share of the budget, and whether it was sent back;
then the plan's timeline peak (`predicted.peak_memory_bytes`, what the memory tests measure within 3 %)
as a share of the budget: how much memory the bound, which the budget is checked against, leaves unused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # hf_tiny; this checkout

from hf_tiny import bench_graph  # noqa: E402

import planner.plans.meshes as meshes  # noqa: E402
from planner import InfeasibleError, plan  # noqa: E402

HARDWARE = "a100-80gb"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="hf-bert,hf-gpt2,hf-llama,gpt-tiny")
    ap.add_argument("--factors", default="1,1.5,2")
    ap.add_argument("--ranks", type=int, default=8)
    args = ap.parse_args()
    seen: list[tuple[str, int, int, int]] = []  # (mesh, formulas' peak, plan's bound, timeline peak) per answer
    measure = meshes._PlanAccount.__call__

    def recording(self, sol):
        bound = measure(self, sol)
        seen.append((str(self.built.mesh), sol.peak_bytes, bound, self.last[1].predicted.peak_memory_bytes))
        return bound

    meshes._PlanAccount.__call__ = recording  # workers=1: every mesh is planned in this process
    print("| model | budget | answers: mesh, formulas' peak -> plan's bound (difference / budget) | sent back | "
          "timeline peak / budget |")
    print("|---|---:|---|---:|---|")
    total = rejected = 0
    for name in args.models.split(","):
        graph = bench_graph(name)
        try:
            plan(graph, 1, world_size=args.ranks, hardware=HARDWARE, workers=1)
            continue  # fits at one byte: nothing to measure
        except InfeasibleError as e:
            smallest = e.min_budget_bytes
        for f in (float(x) for x in args.factors.split(",")):
            seen.clear()
            budget = int(smallest * f)
            plan(graph, budget, world_size=args.ranks, hardware=HARDWARE, workers=1)
            back = sum(bound > budget for _, _, bound, _ in seen)
            total, rejected = total + len(seen), rejected + back
            rows = "; ".join(f"{mesh} {peak:,} -> {bound:,} ({(bound - peak) / budget:+.1%})"
                             for mesh, peak, bound, _ in seen)
            used = ", ".join(f"{timeline / budget:.1%}" for *_, timeline in seen)
            print(f"| {name} | {f:g}x = {budget:,} B | {rows} | {back} of {len(seen)} | {used} |", flush=True)
    print(f"\n{rejected} of {total} answers sent back for a re-solve")


if __name__ == "__main__":
    main()
