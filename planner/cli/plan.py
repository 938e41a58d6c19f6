"""`planner plan MODEL --budget 16GiB --world-size 8`: plan a model and write the plan file.

Also the arguments and helpers `planner frontier` shares: `PLANNING_ARGS`, `planning_options`,
`load_example`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cost_models.schemes import USER_SCHEMES
from planner.cli.registry import CliError, arg, command, err_console, out_console, progress
from planner.cli.report import summary_table
from planner.units import format_bytes, parse_bytes

__all__ = ["PLANNING_ARGS", "planning_options", "load_example", "infeasible_error", "plan_command"]

MODEL_HELP = ("a built-in example (gpt-tiny, gpt2-small, gpt2-xl, gpt3-175b, mlp, hf-gpt2, hf-llama, llama3-8b), "
              "path/to/file.py:factory or package.module:factory, where the factory returns the model and its "
              "example inputs, or a Hugging Face config.json (or a directory holding one), built on the meta device")

PLANNING_ARGS = (
    arg("model", metavar="MODEL", help=MODEL_HELP),
    arg("--world-size", type=int, metavar="N",
        help="number of GPUs (ranks); default: $WORLD_SIZE as set by torchrun"),
    arg("--hardware", metavar="NAME|FILE",
        help="a built-in hardware profile (e.g. a100-80gb, h100-80gb) or a profile JSON from `planner calibrate`"),
    arg("--schemes", metavar="LIST",
        help=f"comma-separated schemes the heavy ops may use: {', '.join(USER_SCHEMES)} (1d = 1d_col + 1d_row; "
             "default: all)"),
    arg("--no-checkpointing", action="store_true", help="never checkpoint activations"),
    arg("--bytes-per-param", metavar="N|PRESET",
        help="model-state bytes per parameter: a number, or fp32_adam (16), bf16_mixed (18), inference (2)"),
    arg("--device", choices=("cuda", "cpu"),
        help="device whose activation semantics the costs assume (default: the hardware profile's)"),
    arg("--time-limit", type=float, metavar="SECONDS",
        help="wall-clock limit per solve (default: none; every solver limit is counted in work, so the same "
             "command gives the same plan on a busy machine; with a limit the plan may differ and says so)"),
    arg("--solver", choices=("highs", "cbc"), help="MILP solver (default: highs)"),
    arg("--prove", action="store_true",
        help="where the plan is not proven optimal, search for the optimum with the exact flat ILP over the "
             "options that can beat it without the work limit it runs with by default (models of at most four "
             "repeated blocks; seconds to a minute more): the solver status says optimal where that proves it; a plan "
             "proven for the solver's memory formulas only is proven as the plan counts, or a faster one found"),
    arg("--inputs", choices=("full", "sharded"),
        help="how the trained model is called: full (default; every rank passes the whole batch and gets whole "
             "outputs, e.g. logits gathered on every rank) or sharded (each rank its block of the batch, as a "
             "data loader per rank gives it); the plan prices the outputs' memory for it and apply_plan runs it so"),
    arg("--optimizer", choices=("single_tensor", "foreach", "fused"),
        help="the torch AdamW implementation training runs, whose step holds temporaries beside every state: "
             "single_tensor (2x the largest parameter), foreach (all parameters once more) or fused (none); "
             "default: torch's for the device (foreach on cuda, single_tensor on cpu)"),
)


def planning_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for `planner.api.plan` from the shared options; options not given are left out so
    the API's defaults apply."""
    options: dict[str, Any] = {"world_size": args.world_size}
    if args.world_size is not None and args.world_size < 1:
        raise CliError(f"--world-size must be a positive number of ranks, got {args.world_size}")
    if args.world_size is not None:
        from cost_models.mesh import MeshError, check_world_size

        try:
            check_world_size(args.world_size)
        except MeshError as e:
            raise CliError(f"--world-size: {e}") from None
    if args.hardware:
        options["hardware"] = args.hardware
    if args.schemes is not None:
        schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
        if not schemes:
            raise CliError("--schemes is empty; list schemes like --schemes 3d,1d or leave the option out")
        options["schemes"] = schemes
    if args.no_checkpointing:
        options["checkpointing"] = False
    if args.bytes_per_param is not None:
        options["bytes_per_param"] = args.bytes_per_param
    if args.device:
        options["device"] = args.device
    if args.time_limit is not None:
        if not args.time_limit > 0:
            raise CliError(f"--time-limit must be a positive number of seconds, got {args.time_limit}")
        options["time_limit"] = args.time_limit
    if args.solver:
        options["solver"] = args.solver
    if args.prove:
        options["prove"] = True
    if args.inputs:
        options["inputs"] = args.inputs
    if args.optimizer:
        options["optimizer"] = args.optimizer
    return options


def load_example(spec: str, batch_size: int | None = None, seq_len: int | None = None) -> Any:
    """The Example (name, model, example_inputs, description) for a MODEL argument (batch_size / seq_len:
    the token ids a config file's model is planned on)."""
    from planner.models.loading import is_config_path, load_model

    for name, v in (("--batch-size", batch_size), ("--seq-len", seq_len)):
        if v is not None and v < 1:
            raise CliError(f"{name} must be a positive integer, got {v}")
    if (batch_size or seq_len) and not is_config_path(spec):
        raise CliError("--batch-size and --seq-len apply to a config.json MODEL only; a factory sets its own inputs")
    with progress(f"building {spec}"):
        return load_model(spec, batch_size=batch_size, seq_len=seq_len)


def infeasible_error(error: Any, budget_bytes: int) -> CliError:
    """Exit-3 error for planner.api.InfeasibleError, saying which budget would fit."""
    need = getattr(error, "min_budget_bytes", None)
    if need is None:
        return CliError(f"{error}; no budget fits with these options (try more ranks or other --schemes)", 3)
    unit = next(k for k in range(5, -1, -1) if need >= 1024**k or k == 0)
    suggestion = f"{-(-need * 10 // 1024**unit) / 10:g}{('B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB')[unit]}"  # rounded up
    return CliError(f"no plan fits in {format_bytes(budget_bytes)} per rank; the smallest budget that fits is "
                    f"{need} bytes ({format_bytes(need)}): try --budget {suggestion}", 3)


@command(
    "plan", "plan a model for N GPUs under a per-GPU memory budget and write the plan file",
    args=[*PLANNING_ARGS,
          arg("--budget", required=True, metavar="SIZE", help="memory per GPU, e.g. 16GiB, 80GB, '1.5 TiB', 1e9"),
          arg("--batch-size", type=int, metavar="B", help="for a config.json MODEL: sequences per step (default 8)"),
          arg("--seq-len", type=int, metavar="T", help="for a config.json MODEL: tokens per sequence (default 1024)"),
          arg("--out", default="plan.json", metavar="FILE",
              help="where to write the plan (default: plan.json); '-' writes it to stdout and the summary to "
                   "stderr")],
    description="Capture MODEL, cost every op under every scheme, and solve for the fastest training step "
                "whose peak memory per GPU fits --budget. Prints a summary and writes the plan as JSON. "
                "Exits with 3 if no plan fits, naming the smallest budget that does.",
)
def plan_command(args: argparse.Namespace) -> int:
    from cost_models.files import check_output_path

    budget = parse_bytes(args.budget)
    options = planning_options(args)
    if args.out != "-":
        check_output_path(args.out, "the plan")  # a device or FIFO at --out: refused before planning
    example = load_example(args.model, args.batch_size, args.seq_len)
    from planner.api import InfeasibleError, plan

    ranks = f"{args.world_size} ranks" if args.world_size else "the world size"
    try:
        with progress(f"planning {example.name} for {ranks} under {format_bytes(budget)} per rank"):
            result = plan(example.model, budget, example_inputs=example.example_inputs, name=example.name,
                          **options)
    except InfeasibleError as e:
        raise infeasible_error(e, budget) from e
    to_stdout = args.out == "-"
    console = err_console() if to_stdout else out_console()
    console.print(summary_table(result))
    unsupported = [f"{a.node} ({a.target})" for a in result.assignments if a.kind == "other"]
    if unsupported:  # kept replicated, not an error: say so, since their memory and time are only estimates
        shown = ", ".join(unsupported[:5]) + (f" and {len(unsupported) - 5} more" if len(unsupported) > 5 else "")
        err_console().print(f"note: {len(unsupported)} op(s) have no parallel strategy and run replicated (their "
                            f"saved activations are not counted): {shown}; `planner explain` lists them")
    whole = [f"{a.node} ({a.target}, {a.strategy})" for a in result.assignments if a.kind == "opaque"]
    if whole:  # counted in full, but what they save is an estimate
        shown = ", ".join(whole[:5]) + (f" and {len(whole) - 5} more" if len(whole) > 5 else "")
        err_console().print(f"note: {len(whole)} op(s) have no parallel layer and run whole on each rank (states "
                            f"counted, saved activations estimated): {shown}")
    if to_stdout:
        sys.stdout.write(result.to_json())
    else:
        try:
            result.save(args.out)
        except OSError as e:
            raise CliError(f"cannot write the plan to {args.out!r}: {e.strerror or e}") from e
        console.print(f"wrote {args.out}")
    if not result.feasible:
        raise CliError(f"the plan's memory bound {format_bytes(result.predicted.bound_bytes)} (states + activations"
                       f" + transient; predicted peak {format_bytes(result.predicted.peak_memory_bytes)}) exceeds "
                       f"the budget {format_bytes(budget)} (solver status {result.solver.status})", 3)
    return 0
