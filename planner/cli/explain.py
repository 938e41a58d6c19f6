"""`planner explain PLAN`: what a plan file decided for every op, and why other schemes were not offered."""

from __future__ import annotations

import argparse
import sys

from planner.cli.registry import arg, command, out_console
from planner.cli.report import check_totals, explain_renderables, solver_line
from planner.plans.format import Plan
from planner.units import format_bytes, format_seconds

__all__ = ["explain", "NARROW"]

NARROW = 120  # columns of the default output: a normal terminal
WIDE = 400  # --wide: as wide as the content needs


@command(
    "explain", "per-op table of a plan file: scheme, layouts, memory, communication, time",
    args=[
        arg("plan_file", metavar="PLAN", help="a plan file written by `planner plan`"),
        arg("--all", dest="show_all", action="store_true",
            help="also list the ops that follow their input's layout, every redistribution, and the schemes "
                 "not offered op by op"),
        arg("--wide", action="store_true",
            help=f"every column in full (strategy, compute / communication / recompute time apart); the default "
                 f"table fits {NARROW} columns"),
    ],
    description="Print the per-op table of a plan (scheme, strategy, layouts in -> out, model-state, saved and "
                "transient bytes, communication bytes, compute and communication time) with totals, the "
                "redistributions between ops, and why other schemes were not offered. Exits with 1 if the "
                "ops do not add up to the plan's prediction.",
)
def explain(args: argparse.Namespace) -> int:
    plan = Plan.load(args.plan_file)
    console = out_console(width=WIDE if args.wide else NARROW)
    for renderable in explain_renderables(plan, show_all=args.show_all, wide=args.wide):
        console.print(renderable)
        console.print()
    p = plan.predicted
    problems = check_totals(plan)
    for line in problems:
        print(f"warning: {line}", file=sys.stderr)
    agreement = "the ops add up to" if not problems else "the ops do NOT add up to"
    console.print(f"{agreement} the prediction: peak {format_bytes(p.peak_memory_bytes)} per rank, "
                  f"{format_bytes(p.bound_bytes)} with everything alive together (budget "
                  f"{format_bytes(plan.budget_bytes)}), step {format_seconds(p.step_time_s)}")
    console.print(f"solver: {solver_line(plan)}")
    return 1 if problems else 0
