"""Prediction fidelity: predicted against measured communication, saved activations and peak memory.

    python bench/fidelity.py                          # every model below, every scheme
    python bench/fidelity.py --model gpt-tiny --no-checkpoint

Models: the built-in gpt-tiny (batch 32, seq 64), hf-gpt2 and hf-llama (planner.models.loading), and the
zoo's hf-bert, hf-vit and hf-opt (tests/zoo: models this project did not write).

For each model, every uniform scheme (replicate, fsdp, 1d, 2d, 3d, 3d_allreduce) and the rule-picked mixed
plan, each without and with every block checkpointed, on 8 forked gloo ranks of this CPU machine: the
plan is applied, one forward/backward is measured (collective bytes by layers3d.CommCounter, saved
activations by planner.verify.measure.SavedActivationMeter) and then one AdamW step's peak memory
(planner.verify.measure_memory). Prints per case: predicted / measured / ratio (measured over predicted) of each,
measured values from the rank with the largest peak. "unplanned" is communication the plan does not
price (input/output conversions of the drop-in interface, and tied weights, e.g. HF GPT-2's wte/lm_head
when the two take different layouts).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

# this checkout's packages first (an editable install of another checkout must not answer), then tests/
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]

import zoo  # noqa: E402
from distributed import run_ranks  # noqa: E402
from fidelity_cases import SCHEMES, make_plans, measure_rank  # noqa: E402

from planner.models.loading import get_example  # noqa: E402
from planner.trace.tracer import capture  # noqa: E402

# name -> overrides of its builder; ZOO_MODELS are built by tests/zoo, the others by get_example
MODELS = {"gpt-tiny": {"batch_size": 32, "seq_len": 64}, "hf-gpt2": {}, "hf-llama": {},
          "hf-bert": {}, "hf-vit": {}, "hf-opt": {}}
ZOO_MODELS = ("hf-bert", "hf-vit", "hf-opt")


def _build(name: str) -> Any:
    ex = zoo.build(name, **MODELS[name]) if name in ZOO_MODELS else get_example(name, device="cpu", **MODELS[name])
    return ex.model, ex.example_inputs


def _ranks(rank: int, name: str, plans: dict[Any, Any]) -> dict[Any, dict[str, Any]]:
    return {key: measure_rank(lambda: _build(name), p) for key, p in plans.items()}


def _ratio(m: int, p: int) -> str:
    return f"{m / p:.3f}" if p else ("-" if not m else "inf")


def run(name: str, checkpoint: tuple[bool, ...]) -> None:
    model, inputs = _build(name)
    graph = capture(model, inputs, name=name)
    t0 = time.perf_counter()
    plans: dict[Any, Any] = {}
    failed: dict[str, str] = {}
    for s in SCHEMES:  # a scheme the planner cannot plan is reported, not fatal
        try:
            plans.update(make_plans(graph, [s], checkpoint))
        except Exception as e:  # noqa: BLE001 - any planning error becomes a table row
            failed[s] = f"{type(e).__name__}: {e}"[:160]
    per_rank = run_ranks(_ranks, 8, timeout_s=1200, args=(name, plans))
    secs = time.perf_counter() - t0
    print(f"\n{name} {MODELS[name] or ''} on 8 ranks: predicted / measured / ratio (bytes per rank; {secs:.0f} s)")
    head = f"{'scheme':>14} {'ckpt':>4} | {'comm':^30} | {'saved activations':^30} | {'peak memory':^32} | unplanned"
    print(head)
    print("-" * len(head))
    for scheme, ck in plans:
        rows = [r[(scheme, ck)] for r in per_rank]
        r = max(rows, key=lambda x: x["peak"])
        lo = min(x["peak"] for x in rows) / max(r["predicted_peak"], 1)
        print(f"{scheme:>14} {'yes' if ck else 'no':>4} | "
              f"{r['predicted_comm']:>11,} {r['comm']:>11,} {_ratio(r['comm'], r['predicted_comm']):>6} | "
              f"{r['predicted_activations']:>11,} {r['activations']:>11,} "
              f"{_ratio(r['activations'], r['predicted_activations']):>6} | "
              f"{r['predicted_peak']:>11,} {r['peak']:>11,} {_ratio(r['peak'], r['predicted_peak']):>6}"
              f"{'' if abs(lo - r['peak'] / r['predicted_peak']) < 5e-4 else f' (min {lo:.3f})'} | "
              f"{r['unplanned_comm']:,}")
    for s, why in failed.items():
        print(f"{s:>14}    - | no plan: {why}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", choices=sorted(MODELS), help="default: all")
    ap.add_argument("--no-checkpoint", action="store_true", help="only the plans without checkpointing")
    args = ap.parse_args()
    for name in args.model or list(MODELS):
        run(name, (False,) if args.no_checkpoint else (False, True))


if __name__ == "__main__":
    main()
