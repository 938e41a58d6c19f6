"""Issue 16 acceptance sweep: each zoo model planned at a budget that forces sharding and at one that does not,
and under each uniform scheme its shapes allow; every plan verified on 8 gloo ranks (`run_verify`, 2 AdamW
steps) with the measured peak compared to the predicted one.

    python bench/zoo_fallback_sweep.py torch-cnn [hf-bert ...] [--schemes loose,tight,fsdp,...] [--out FILE]

Per plan it prints (and appends as one JSON line to --out): the budget, the predicted peak and model states,
the dense floor 16 x params / 8, whether verify passed (numerics, collectives, activations, peak), and the
measured peak per rank against the predicted peak. A model the planner refuses prints the refusal.
Slow: minutes per model on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

WORLD = 8
SPECS = {"torch-cnn": "zoo.torch_layers:torch_cnn", "torch-lstm-lm": "zoo.torch_layers:torch_lstm_lm",
         "torch-transformer-encoder": "zoo.torch_layers:torch_transformer_encoder", "hf-vit": "zoo.vision:hf_vit",
         "hf-t5": "zoo.seq2seq:hf_t5", "hf-bert": "zoo.encoders:hf_bert", "hf-opt": "zoo.encoders:hf_opt"}


def _plans(name: str, which: list[str]) -> tuple[dict[str, Any], dict[str, str], int]:
    import torch  # noqa: F401
    import zoo
    from apply_plans import HARDWARE, mesh_for

    from cost_models.mesh import Mesh
    from planner.api import plan

    ex = zoo.build(name)
    params = sum(p.numel() for p in ex.model.parameters())

    def go(budget: Any, schemes: list[str] | None, meshes: list[Mesh] | None) -> Any:
        return plan(ex.model, budget, world_size=WORLD, example_inputs=ex.example_inputs, schemes=schemes,
                    hardware=HARDWARE, device="cpu", meshes=meshes, workers=1)

    plans, refused = {}, {}
    rep = go("1GiB", ["replicate"], [Mesh((WORLD,))])
    for w in which:
        try:
            if w == "loose":
                plans[w] = go("1GiB", None, None)
            elif w == "tight":  # the replicated model states: the states must shrink (activations need room too)
                plans[w] = go(rep.predicted.model_state_bytes, None, None)
            else:
                plans[w] = go("1GiB", [w], [mesh_for(w)])
        except Exception as e:  # a refusal names the op: record it
            refused[w] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return plans, refused, params


def _rank(rank: int, spec: str, paths: dict[str, str]) -> dict[str, Any]:
    import io

    import planner.verify.report as report_mod
    from planner.verify.run import run_verify

    out: dict[str, Any] = {}
    for w, path in paths.items():
        seen: list[Any] = []
        orig = report_mod.format_report

        def keep(r: Any, orig: Any = orig, seen: list[Any] = seen) -> str:
            seen.append(r)
            return orig(r)
        report_mod.format_report = keep
        try:
            status = run_verify(spec, path, steps=2, out=io.StringIO())
        finally:
            report_mod.format_report = orig
        if seen:
            r = seen[0]
            out[w] = {"status": status, "numeric": r.numeric_ok(), "comm": r.comm_ok(), "act": r.act_ok(),
                      "peak_ok": r.peak_ok(), "measured_peak": r.measured_peak, "predicted_peak": r.predicted_peak,
                      "measured_act": r.measured_act, "predicted_act": r.predicted_act,
                      "errors": [(e.what, e.error) for e in r.errors]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--schemes", default="loose,tight")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from distributed import run_ranks

    for name in args.models:
        t0 = time.time()
        plans, refused, params = _plans(name, args.schemes.split(","))
        floor = 16 * params // WORLD
        with tempfile.TemporaryDirectory() as tmp:
            paths = {}
            for w, p in plans.items():
                paths[w] = f"{tmp}/{w}.json"
                p.save(paths[w])
            verified = run_ranks(_rank, WORLD, timeout_s=1800, args=(SPECS[name], paths))[0] if paths else {}
        for w in args.schemes.split(","):
            row: dict[str, Any] = {"model": name, "plan": w, "params": params, "dense_floor": floor}
            if w in refused:
                row["refused"] = refused[w]
            else:
                p, v = plans[w], verified.get(w, {})
                sharded = {a.scheme for a in p.assignments if a.params}
                row.update(budget=p.budget_bytes, mesh=str(p.mesh), predicted_peak=p.predicted.peak_memory_bytes,
                           model_states=p.predicted.model_state_bytes, heavy_schemes=sorted(sharded),
                           checkpoint=list(p.checkpoint))
                row.update(v)
                if v.get("measured_peak"):
                    row["peak_err_max"] = max((m - v["predicted_peak"]) / v["predicted_peak"] for m in v["measured_peak"])
                    row["peak_over_budget"] = max(v["measured_peak"]) > p.budget_bytes
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
        print(f"# {name}: {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
