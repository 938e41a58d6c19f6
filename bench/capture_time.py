"""Capture time and peak memory of the built-in examples, each in a fresh process.

    python bench/capture_time.py                      # gpt2-xl and gpt3-175b on meta
    python bench/capture_time.py gpt-tiny hf-gpt2 --device cpu

For each model a child process imports torch and planner, builds the example, captures it once and
prints build seconds, capture seconds (the first capture in the process, as a user sees it, including
torch's lazy imports; wall clock and CPU time, the latter being what to compare on a busy machine) and
peak RSS from resource.getrusage. Goals (measured, never asserted): gpt2-xl on
meta < 3 s, gpt3-175b on meta < 10 s, peak RSS < 2 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(name: str, device: str | None) -> dict[str, object]:
    """Runs in the child process: build, capture, report."""
    sys.path.insert(0, ROOT)
    t0 = time.perf_counter()
    import torch  # noqa: F401  (import time reported separately from build and capture)

    from planner.models import get_example
    from planner.trace.tracer import capture

    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    ex = get_example(name, device=device)
    t_build = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    graph = capture(ex.model, ex.example_inputs, name=name)
    t_capture, c_capture = time.perf_counter() - t0, time.process_time() - c0
    # ru_maxrss is KiB on Linux, bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    return {"model": name, "method": graph.method, "ops": len(graph), "params": graph.param_numel(),
            "import_s": round(t_import, 2), "build_s": round(t_build, 2), "capture_s": round(t_capture, 2), "capture_cpu_s": round(c_capture, 2),
            "peak_rss_mib": round(peak / 2**20)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["gpt2-xl", "gpt3-175b"])
    parser.add_argument("--device", default=None, help="cpu or meta (default: each example's own default)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.models[0], args.device)))
        return
    print(f"{'model':<12} {'method':<7} {'ops':>6} {'params':>16} {'import s':>9} {'build s':>8} {'capture s':>10} "
          f"{'(cpu s)':>8} {'peak RSS MiB':>13}")
    for name in args.models:
        cmd = [sys.executable, os.path.abspath(__file__), name, "--child"]
        if args.device:
            cmd += ["--device", args.device]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"{name:<12} failed:\n{out.stderr[-2000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['model']:<12} {r['method']:<7} {r['ops']:>6} {r['params']:>16,} {r['import_s']:>9} "
              f"{r['build_s']:>8} {r['capture_s']:>10} {r['capture_cpu_s']:>8} {r['peak_rss_mib']:>13}")


if __name__ == "__main__":
    main()
