"""The pieces every `planner` subcommand uses: registration, user errors, consoles and a progress spinner.

A subcommand is one function registered with `@command`, taking the parsed arguments and returning the
exit status; its module is listed in `planner.cli.app.COMMAND_MODULES`:

    @command("verify", "compare the parallel model with the dense one under torchrun",
             args=[arg("model", metavar="MODEL"), arg("plan_file", metavar="PLAN")])
    def verify(args: argparse.Namespace) -> int:
        ...
        return 0

Raise a ValueError subclass for anything the user can fix (`CliError` when no better class exists): the
command line prints `error: <message>` and exits with `exit_code` (2 by default), without a traceback.
Import heavy modules (torch, the solver) inside the function so `planner --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from cost_models.errors import PlannerError

__all__ = ["Arg", "Command", "COMMANDS", "CliError", "arg", "command", "progress", "out_console", "err_console"]

RunFn = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Arg:
    """One `parser.add_argument(*flags, **options)` call, kept as data until the parser is built."""

    flags: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, one-line help, arguments and the function that runs it."""

    name: str
    help: str
    args: tuple[Arg, ...]
    run: RunFn
    description: str = ""


COMMANDS: dict[str, Command] = {}


class CliError(PlannerError, ValueError):
    """A user error found by the command line itself; `exit_code` is the process exit status."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def arg(*flags: str, **options: Any) -> Arg:
    """Describe one argument exactly as `argparse.ArgumentParser.add_argument` takes it."""
    return Arg(tuple(flags), dict(options))


def command(name: str, help: str, args: Sequence[Arg] = (), description: str = "") -> Callable[[RunFn], RunFn]:
    """Register the decorated function as subcommand `name` (the function is returned unchanged)."""
    def register(run: RunFn) -> RunFn:
        if name in COMMANDS and COMMANDS[name].run is not run:
            raise AssertionError(f"two subcommands are registered as {name!r}")
        COMMANDS[name] = Command(name, help, tuple(args), run, description or help)
        return run
    return register


def out_console(to_stderr: bool = False, width: int | None = None) -> Console:
    """A console on stdout (or stderr): no markup (plan text such as "3d[roles=xyz]" is printed as is), and
    wide when not a terminal so that tables are not cut in files and pipes. `width`: at most this many
    columns (a narrower terminal keeps its own width)."""
    stream = sys.stderr if to_stderr else sys.stdout
    if width is not None:
        if stream.isatty():
            width = min(width, Console(file=stream).width)
    else:
        width = None if stream.isatty() else 200
    return Console(file=stream, width=width, highlight=False, markup=False, soft_wrap=False)


def err_console() -> Console:
    return out_console(to_stderr=True)


@contextmanager
def progress(message: str, delay_s: float = 1.0) -> Iterator[None]:
    """Show a spinner with `message` on stderr if the work takes longer than `delay_s` (terminals only)."""
    console = Console(file=sys.stderr)
    if not console.is_terminal:
        yield
        return
    status = console.status(message)
    timer = threading.Timer(delay_s, status.start)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        status.stop()
