"""End-to-end plan() time (capture + costs + solve) against model depth and world size.

    python bench/plan_time.py                      # gpt2-xl and gpt3-175b on 64 ranks, GPT-3 depth sweep
    python bench/plan_time.py --quick              # fewer points
    python bench/plan_time.py --only llama3-8b     # the rows of one model

Plans are made for `inputs="sharded"` (each rank its block of the batch, as training feeds it): with
"full" a language model's logits would be gathered whole on every rank (31 GiB for LLaMA-3-8B's batch).
Prints seconds per row, measured in this process one after another; the growth with layers should be
near-linear because identical layers are solved once per class (two-level solve).
"""

from __future__ import annotations

import argparse
import time

from planner import get_example, plan
from planner.trace.tracer import capture


def timed_plan(name: str, world: int, budget: str, **overrides) -> tuple[float, float, object]:
    ex = get_example(name, device="meta", **overrides)
    t0 = time.perf_counter()
    graph = capture(ex.model, ex.example_inputs, name=name)
    t1 = time.perf_counter()
    p = plan(graph, budget, world_size=world, inputs="sharded")
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0, p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", metavar="NAME", help="run only the rows of this model")
    args = ap.parse_args()
    rows = [("gpt2-xl", 64, "20GiB", {}), ("gpt3-175b", 64, "80GiB", {}), ("llama3-8b", 64, "40GiB", {})]
    depths = [12, 24] if args.quick else [12, 24, 48, 96]
    rows += [("gpt3-175b", 64, "80GiB", {"n_layer": n}) for n in depths]
    rows += [("gpt2-xl", w, "20GiB", {}) for w in ([8] if args.quick else [8, 512])]
    if args.only:
        rows = [r for r in rows if r[0] == args.only]
    print(f"{'model':<12} {'layers':>6} {'ranks':>5} {'capture s':>9} {'plan s':>8} {'mesh':>12} {'solver':>18}")
    for name, world, budget, over in rows:
        t_cap, t_all, p = timed_plan(name, world, budget, **over)
        layers = over.get("n_layer", "default")
        print(f"{name:<12} {layers!s:>6} {world:>5} {t_cap:>9.2f} {t_all:>8.2f} {str(p.mesh.shape):>12} "
              f"{p.solver.method + '/' + p.solver.status:>18}", flush=True)


if __name__ == "__main__":
    main()
