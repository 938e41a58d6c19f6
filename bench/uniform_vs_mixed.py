"""Mixed per-op plans against uniform-scheme plans, budget by budget, measured side by side.

    python bench/uniform_vs_mixed.py                       # gpt2-xl and gpt3-175b on 64 ranks
    python bench/uniform_vs_mixed.py --model gpt2-xl --budgets 8GiB,16GiB,24GiB

For each budget: the planner's mixed plan (every scheme per op, checkpointing allowed) and each uniform
plan (all heavy ops replicate, fsdp, 1d, 2d, 3d or 3d_allreduce; with and without checkpointing). Prints
predicted step time (ms) or "-" when the uniform plan does not fit, and the ratio uniform / mixed for the
best uniform plan that fits (a ratio below 1 would mean the mixed search missed a uniform plan: the row is
marked). The mixed plan may fit where no uniform plan does ("only mixed fits"); with --smallest a last row
gives the smallest budget each one fits, as the planner reports it.
"""

from __future__ import annotations

import argparse

from planner import InfeasibleError, get_example, parse_bytes, plan
from planner.trace.tracer import capture
from planner.units import format_bytes

UNIFORM = ["replicate", "fsdp", "1d", "2d", "3d", "3d_allreduce"]
DEFAULT_BUDGETS = {"gpt2-xl": "768MiB,1GiB,2GiB,4GiB,8GiB,16GiB,32GiB",
                   "gpt3-175b": "46GiB,48GiB,60GiB,80GiB,120GiB,160GiB"}


def step_ms(graph, budget: int, world: int, **kw) -> float | None:
    try:
        return plan(graph, budget, world_size=world, **kw).predicted.step_time_s * 1e3
    except InfeasibleError:
        return None


def smallest(graph, world: int, **kw) -> int | None:
    """The smallest budget the planner reports as feasible (planning at 1 byte per rank)."""
    try:
        return plan(graph, 1, world_size=world, **kw).predicted.peak_memory_bytes
    except InfeasibleError as e:
        return e.min_budget_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="built-in model (default: gpt2-xl and gpt3-175b)")
    ap.add_argument("--world-size", type=int, default=64)
    ap.add_argument("--budgets", help="comma-separated budgets (default per model)")
    ap.add_argument("--smallest", action="store_true",
                    help="also print each plan's smallest feasible budget (as the planner reports it)")
    args = ap.parse_args()
    for name in args.model or ["gpt2-xl", "gpt3-175b"]:
        ex = get_example(name, device="meta")
        graph = capture(ex.model, ex.example_inputs, name=name)
        budgets = [parse_bytes(b) for b in (args.budgets or DEFAULT_BUDGETS.get(name, "16GiB")).split(",")]
        cols = [(s, c) for s in UNIFORM for c in (True, False)]
        head = " ".join(f"{s + ('+ck' if c else ''):>15}" for s, c in cols)
        print(f"\n{name} on {args.world_size} ranks: predicted step time (ms); '-' = does not fit")
        print(f"{'budget':>10} {'mixed':>9} {head} {'best uniform/mixed':>18}")
        for b in budgets:
            mixed = step_ms(graph, b, args.world_size)
            uni = [step_ms(graph, b, args.world_size, schemes=[s], checkpointing=c) for s, c in cols]
            fits = [u for u in uni if u is not None]
            ratio = (min(fits) / mixed) if (fits and mixed) else None
            cells = " ".join(f"{u:>15.2f}" if u is not None else f"{'-':>15}" for u in uni)
            mixed_s = f"{mixed:>9.2f}" if mixed is not None else f"{'-':>9}"
            ratio_s = f"{ratio:>18.3f}" if ratio is not None else f"{'only mixed fits' if mixed else '-':>18}"
            slower = mixed is not None and fits and mixed > min(fits) * (1 + 1e-6)
            print(f"{format_bytes(b):>10} {mixed_s} {cells} {ratio_s}" + ("  MIXED SLOWER" if slower else ""),
                  flush=True)
        if args.smallest:
            least = [smallest(graph, args.world_size)] + [smallest(graph, args.world_size, schemes=[s],
                                                                   checkpointing=c) for s, c in cols]
            cells = " ".join(f"{format_bytes(x) if x else '-':>15}" for x in least[1:])
            print(f"{'smallest':>10} {format_bytes(least[0]) if least[0] else '-':>9} {cells}", flush=True)


if __name__ == "__main__":
    main()
