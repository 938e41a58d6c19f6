"""`planner calibrate`: measure the cluster and write the hardware profile the planner prices plans with.

    torchrun --standalone --nproc-per-node 8 -m planner calibrate --out profile.json
    planner plan MODEL --budget 16GiB --world-size 8 --hardware profile.json

The ranks are laid out as the meshes the planner tries for this world size (`candidate_meshes`); on
communicator groups over their mesh axes (one per link and group size, or every one with --every-group),
all-gather, reduce-scatter, all-reduce, all-to-all and broadcast are timed over geometric message sizes
from --min-bytes to --max-bytes within --time-budget seconds, and those whose fit is poor (R^2 < 0.9) are
timed again within --retry-budget seconds; alpha and beta are fitted per (link, collective, group size)
on exactly the cost model's formulas; matmul FLOP/s
(fp32, bf16) and copy bandwidth are measured on every rank at once. Rank 0 writes a hardware profile
(atomically): the --base profile with the measured numbers and the alpha/beta overrides, and prints the
fit quality (R^2, worst relative residual).
The process group comes from torchrun's environment (NCCL with CUDA, else gloo); without torchrun it runs
as one rank and measures compute and memory only. Also runnable as `python -m planner.cli.calibrate`.

This module is light (no torch import) so that `planner --help` stays fast; the work is in
`planner.calibrate.run` (orchestration and profile), `planner.calibrate.measure` (timing) and
`planner.calibrate.fit` (least squares).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from cost_models.errors import PlannerError
from cost_models.redistribution import COLLECTIVE_KINDS
from planner.calibrate.config import CalibrateConfig, CalibrateError
from planner.cli.registry import arg, command
from planner.units import BudgetError, parse_bytes

__all__ = ["CALIBRATE_ARGS", "config_from_args", "calibrate_command", "main"]


CALIBRATE_ARGS = (
    arg("--out", required=True, metavar="FILE", help="profile JSON to write (atomically, by rank 0)"),
    arg("--base", metavar="NAME|FILE", help="profile to start from: a built-in name (a100-80gb, h100-80gb, "
        "cpu-gloo) or a profile JSON; default: cpu-gloo on CPU, h100-80gb on H100/H200, else a100-80gb"),
    arg("--min-bytes", default="4KiB", metavar="SIZE", help="smallest message (default 4KiB)"),
    arg("--max-bytes", default="256MiB", metavar="SIZE", help="largest message (default 256MiB)"),
    arg("--growth", type=int, default=8, metavar="K", help="factor between message sizes (default 8)"),
    arg("--time-budget", type=float, default=50.0, metavar="SECONDS",
        help="seconds for all collective timings together; sizes stop growing when it runs out (default 50)"),
    arg("--retry-budget", type=float, default=25.0, metavar="SECONDS",
        help="further seconds to re-time collectives whose fit has R^2 < 0.9, e.g. after a burst of "
        "background load (default 25; 0: no retries)"),
    arg("--warmup", type=int, default=2, metavar="N", help="untimed calls per size (default 2)"),
    arg("--reps", type=int, default=9, metavar="N",
        help="timed batches per size over all passes; the median is kept (default 9)"),
    arg("--passes", type=int, default=3, metavar="N",
        help="sweeps over all sizes, each with reps/passes batches, so bursts of load average out (default 3)"),
    arg("--timeout", type=float, default=120.0, metavar="SECONDS",
        help="seconds before a collective waiting on a dead rank fails (default 120)"),
    arg("--kinds", default=",".join(COLLECTIVE_KINDS), metavar="LIST",
        help="comma-separated collectives to time (default: all five)"),
    arg("--every-group", action="store_true",
        help="time every distinct group over mesh axes, not one per (link, group size)"),
    arg("--compute-seconds", type=float, default=0.5, metavar="SECONDS",
        help="time per matmul dtype and for the copy bandwidth (default 0.5)"),
    arg("--samples", metavar="FILE", help="also write every measured point as CSV"),
)


def config_from_args(args: argparse.Namespace) -> CalibrateConfig:
    """The config from parsed CALIBRATE_ARGS; raises CalibrateError (a ValueError) for bad values."""
    try:
        min_bytes, max_bytes = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
    except BudgetError as e:
        raise CalibrateError(f"--min-bytes/--max-bytes: {e}") from None
    for option, path in (("--out", args.out), ("--samples", getattr(args, "samples", None))):
        if path is None:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise CalibrateError(f"{option} {path}: directory {folder} does not exist; create it first")
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    return CalibrateConfig(base=args.base, min_bytes=min_bytes, max_bytes=max_bytes, growth=args.growth,
                           time_budget_s=args.time_budget, retry_budget_s=args.retry_budget, warmup=args.warmup,
                           reps=args.reps, passes=args.passes,
                           timeout_s=args.timeout, kinds=kinds, every_group=args.every_group,
                           compute_seconds=args.compute_seconds)


def calibrate_command(args: argparse.Namespace) -> int:
    """`planner calibrate`: validate everything before any communication, then measure on every rank.

    A bad argument fails on every rank before the process group exists; under torchrun only rank 0 reports
    it (the others exit with the same status silently), so the message is printed once.
    """
    from cost_models.files import check_output_path
    from cost_models.hardware import load_profile

    try:
        config = config_from_args(args)
        if config.base is not None:
            load_profile(config.base)
        check_output_path(args.out, "the hardware profile")  # before a minute of measuring, not after
        if args.samples:
            check_output_path(args.samples, "the calibration samples")
    except PlannerError:
        if os.environ.get("RANK", "0") != "0":
            return 2
        raise
    from planner.calibrate.run import run

    if "RANK" not in os.environ:  # one process, no launcher: nothing to wait for
        run(config, args.out, samples_out=args.samples)
        return 0
    from planner.verify.guard import BACKEND_GRACE_S, RankGuard, init_distributed

    # Under torchrun: the same guard as verify. A rank that fails stops every rank with its message, and a
    # rank waiting in one collective longer than --timeout names the collective and the missing peers
    # (the backend's own timeout comes later, so the guard is the one that speaks).
    ctx = init_distributed(timeout_s=config.timeout_s + BACKEND_GRACE_S)
    with RankGuard(ctx.guard_store, ctx.rank, ctx.world_size, debug=getattr(args, "debug", False),
                   deadline_s=config.timeout_s):
        run(config, args.out, samples_out=args.samples)
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m planner.cli.calibrate ...`: the `planner calibrate` subcommand on its own."""
    from planner.cli.app import main as cli_main

    return cli_main(["calibrate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    # Run the importable copy of this module: registering this __main__ copy as well would give the
    # command line two different functions named "calibrate".
    from planner.cli.calibrate import main as _main

    sys.exit(_main())
else:
    command("calibrate", "measure collectives, matmul FLOP/s and memory bandwidth; write a hardware profile "
            "(run under torchrun)", args=CALIBRATE_ARGS,
            description=(__doc__ or "").split("\n\nThis module is light")[0])(calibrate_command)
