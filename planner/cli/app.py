"""The `planner` command line: `planner plan`, `planner explain`, `planner frontier`, ...

Subcommands live in the modules of `COMMAND_MODULES`, each registered with `planner.cli.registry.command`
(see that module for how to add one). User errors (a `PlannerError`: a bad budget, a model that does not
load, a broken plan file, a budget nothing fits) print one line `error: ...` to stderr and exit with 2,
or 3 when no plan fits the budget; `--debug` prints the traceback as well. Any other exception is a bug
in the planner: one line `internal error, please report ...` (exit 70), the traceback under `--debug`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import re
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from cost_models.errors import PlannerError, PlannerWarning, internal_error_line, one_line
from cost_models.schemes import BASELINE_SCHEMES
from planner.cli.registry import COMMANDS

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

# Modules whose import registers subcommands, in the order `planner --help` lists them.
COMMAND_MODULES = ("planner.cli.plan", "planner.cli.explain", "planner.cli.frontier", "planner.cli.calibrate",
                   "planner.cli.verify")

EXIT_USER_ERROR = 2
EXIT_INFEASIBLE = 3
EXIT_INTERNAL = 70  # EX_SOFTWARE of sysexits.h: a bug in the planner, not in what the user gave it
# torch loggers that print a traceback of their own (at ERROR) for a failure the command line then reports
# as one line: a model whose example inputs do not fit it fails a meta kernel while it is captured.
_NOISY_LOGGERS = ("torch._subclasses.fake_tensor",)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    for module in COMMAND_MODULES:
        importlib.import_module(module)
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the full traceback of an error")
    parser = argparse.ArgumentParser(
        prog="planner", parents=[debug],
        description="Memory-budgeted auto-parallelization planner for PyTorch: picks a tensor-parallel scheme "
                    f"({', '.join(BASELINE_SCHEMES)}) and activation checkpointing per op so that "
                    "one training step is as fast as possible within a per-GPU memory budget.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in COMMANDS.values():
        sub = subparsers.add_parser(cmd.name, help=cmd.help, description=cmd.description, parents=[debug])
        for a in cmd.args:
            sub.add_argument(*a.flags, **a.options)
        sub.set_defaults(run=cmd.run)
        _values_may_start_with_minus(sub)
    _values_may_start_with_minus(parser)
    return parser


def _values_may_start_with_minus(parser: argparse.ArgumentParser) -> None:
    """Let `--budget -1GiB` reach the option (whose own check says what is wrong with a negative size)
    instead of argparse taking "-1GiB" for an unknown option and printing its usage block. argparse reads
    an argument as a value when it looks like a negative number and no option does; that test is widened
    from "-1" / "-1.5" to anything starting with a minus and a digit or a point."""
    parser._negative_number_matcher = re.compile(r"^-\.?\d")  # noqa: SLF001 - argparse has no public switch



@contextlib.contextmanager
def _quiet_torch(quiet: bool) -> Iterator[None]:
    """Silence `_NOISY_LOGGERS` while a command runs (unless --debug), so a user error stays one line. A
    filter rather than a level: torch's logging set-up resets the levels of its loggers when it starts."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS] if quiet else []
    drop = _DropBelowCritical()
    for lg in loggers:
        lg.addFilter(drop)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(drop)


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Show a PlannerWarning as one line `warning: ...` on stderr (not Python's file:line form)."""
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, *rest: Any) -> None:
        if issubclass(category, PlannerWarning):
            print(f"warning: {one_line(message) if isinstance(message, BaseException) else message}",
                  file=sys.stderr)
        else:
            shown(message, category, filename, lineno, *rest)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


class _DropBelowCritical(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.CRITICAL


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default: sys.argv[1:]) and return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USER_ERROR
    try:
        with _quiet_torch(not getattr(args, "debug", False)), _warnings_as_lines():
            return args.run(args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except PlannerError as e:
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"error: {one_line(e)}", file=sys.stderr)
        return getattr(e, "exit_code", EXIT_USER_ERROR)
    except Exception as e:  # noqa: BLE001 - anything else is a bug: say so in one line
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(internal_error_line(e), file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
