"""`planner verify MODEL plan.json`: the command line of the verify stage (`planner.verify.run`).

Run under `torchrun --standalone --nproc-per-node N -m planner verify MODEL plan.json`; also runnable as
`python -m planner.cli.verify ...`. The work (building both models, comparing, measuring) is in
`planner.verify.run.run_verify`; this module only reads the arguments, starts the process group and the
guard that stops every rank when one fails.
"""

from __future__ import annotations

import argparse
import sys

from planner.cli.registry import CliError, arg, command
from planner.verify.run import run_verify

__all__ = ["verify_command", "main"]


@command("verify", "run the parallel model next to the dense one under torchrun and compare",
         args=[arg("model", metavar="MODEL", help="built-in example name, path/to/file.py:factory or "
                                                  "package.module:factory (the model the plan was made for)"),
               arg("plan_file", metavar="PLAN", help="plan JSON written by `planner plan`"),
               arg("--steps", type=int, default=0, help="AdamW steps to run after the first comparison"),
               arg("--tol", type=float, default=1e-5, help="largest relative error allowed (default 1e-5)"),
               arg("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)"),
               arg("--act-tol", type=float, default=0.05,
                   help="allowed relative difference of measured and predicted activation bytes (default 0.05)"),
               arg("--lr", type=float, default=1e-4, help="AdamW learning rate for --steps (default 1e-4)"),
               arg("--adam-eps", type=float, default=1e-6,
                   help="AdamW epsilon (default 1e-6: with torch's 1e-8, parameters whose gradient is zero in "
                        "exact arithmetic, such as the attention key bias, move by rounding noise, which no two "
                        "summation orders reproduce)"),
               arg("--timeout", type=float, default=300.0,
                   help="seconds a collective (or the ranks' start-up agreement) may wait before the run stops, "
                        "naming the collective and the ranks missing from it (default 300)")],
         description="Run under `torchrun --standalone --nproc-per-node N -m planner verify MODEL plan.json`: "
                     "builds the dense and the parallel model from the same seed, compares outputs, loss, "
                     "gradients (and --steps AdamW steps), and measured against predicted communication and "
                     "activation bytes. Exits 1 when anything is off; a failing rank stops every rank.")
def verify_command(args: argparse.Namespace) -> int:
    from planner.verify.guard import BACKEND_GRACE_S, RankGuard, init_distributed

    if args.steps < 0 or args.tol <= 0 or args.act_tol < 0:
        raise CliError("--steps must be >= 0, --tol > 0 and --act-tol >= 0")
    if not args.timeout > 0:
        raise CliError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    # The backend's own timeout comes later than the guard's deadline, so that the guard, which can name
    # the collective and the missing peers, is the one that stops a stuck run.
    ctx = init_distributed(timeout_s=args.timeout + BACKEND_GRACE_S)
    with RankGuard(ctx.guard_store, ctx.rank, ctx.world_size, debug=getattr(args, "debug", False),
                   deadline_s=args.timeout):
        status = run_verify(args.model, args.plan_file, steps=args.steps, tol=args.tol, seed=args.seed,
                            act_tol=args.act_tol, lr=args.lr, adam_eps=args.adam_eps, agree_timeout_s=args.timeout)
    _shutdown()
    return status


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """`python -m planner.cli.verify MODEL plan.json ...` (the same as `planner verify`)."""
    from planner.cli.app import main as cli_main

    return cli_main(["verify", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
