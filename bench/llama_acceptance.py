"""Issue 14's acceptance run on the zoo's Llama family: every uniform scheme the shapes allow and the
planner's own plan at a budget that forces sharding, applied on 8 forked gloo ranks of this CPU machine
and compared with the dense model (two AdamW steps).

    python bench/llama_acceptance.py                      # hf-llama, hf-mistral, hf-qwen2, hf-gpt-neox, titan-llama
    python bench/llama_acceptance.py --model hf-llama --schemes 3d mixed

Per plan: pass/fail of tests/llama_cases.py's `check` (loss, gradients and parameters within 1e-5,
measured collective bytes per (kind, phase) equal to the predicted, saved activations within 5 %, no
family op left replicated), the total collective bytes measured and predicted, the saved activation
bytes measured and predicted, and the ops that ran replicated ('other').
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]  # this checkout first

from llama_cases import LLAMAS, check, run_cases  # noqa: E402
from zoo import ZOO  # noqa: E402


def _row(key: tuple[str, str], r: dict[str, Any]) -> str:
    try:
        check(key, r)
        verdict = "pass"
    except AssertionError as e:
        verdict = f"FAIL ({str(e).splitlines()[0][:80]})"
    measured, predicted = sum(r["measured_comm"].values()), sum(r["predicted_comm"].values())
    act_m, act_p = r["activation_bytes"], r["predicted_activation_bytes"]
    other = sorted({a.target for a in r["plan"].assignments if a.kind == "other"})
    return (f"| {key[0]} | {key[1]} | {verdict} | {measured:,} | {predicted:,} | {act_m:,} | {act_p:,} | "
            f"{act_p / act_m:.3f} | {r['grad_error']:.1e} | {', '.join(other) or '-'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="*", default=list(LLAMAS), choices=LLAMAS)
    ap.add_argument("--schemes", nargs="*", help="default: the model's uniform schemes and 'mixed'")
    args = ap.parse_args()
    print("| model | plan | check | comm bytes measured | predicted | saved act. measured | predicted | "
          "pred/meas | grad error | ran replicated |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.model:
        if not ZOO[name].available():
            print(f"| {name} | - | skipped: needs {', '.join(ZOO[name].requires)} | | | | | | | |")
            continue
        schemes = tuple(args.schemes) if args.schemes else ZOO[name].schemes + ("mixed",)
        t0 = time.perf_counter()
        try:
            results = run_cases({name: schemes})
        except Exception as e:  # noqa: BLE001 - a model that cannot be planned or run is a row, not the end
            print(f"| {name} | {' '.join(schemes)} | ERROR {type(e).__name__}: {str(e).splitlines()[0][:160]} "
                  "| | | | | | | |", flush=True)
            continue
        for key, r in results.items():
            print(_row(key, r), flush=True)
        print(f"<!-- {name}: {time.perf_counter() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
