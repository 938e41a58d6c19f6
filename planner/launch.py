"""`python -m planner.launch [torchrun options] verify|calibrate ...`: torchrun, ending with the planner's
own message when a rank fails.

Launched with `torchrun ... -m planner verify ...`, a failed run ends with torchrun's `ChildFailedError`
traceback (a screen of text) below the one line the planner printed. This launcher runs the same
torchrun (its own options, e.g. `--standalone --nproc-per-node 8`, come first), and when a rank fails it
prints, as the last line, the failure every rank agreed on (`[planner] rank R: error: ...`, written by
`planner.verify.guard.RankGuard` to the file named by $PLANNER_FAILURE_FILE), and exits with that rank's
status (2 a user error, 1 anything else):

    python -m planner.launch --standalone --nproc-per-node 8 verify gpt2-small plan.json
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Sequence

__all__ = ["COMMANDS", "FAILURE_FILE_ENV", "main"]

COMMANDS = ("verify", "calibrate")
FAILURE_FILE_ENV = "PLANNER_FAILURE_FILE"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    at = next((i for i, a in enumerate(argv) if a in COMMANDS), None)
    if at is None:
        print(f"error: name the planner command to launch ({', '.join(COMMANDS)}) after torchrun's options, e.g. "
              "python -m planner.launch --standalone --nproc-per-node 8 verify MODEL plan.json", file=sys.stderr)
        return 2
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    fd, failure_file = tempfile.mkstemp(prefix="planner-failure-", suffix=".txt")
    os.close(fd)
    os.environ[FAILURE_FILE_ENV] = failure_file  # the ranks inherit it
    try:
        args = get_args_parser().parse_args([*argv[:at], "-m", "planner", *argv[at:]])
        try:
            run(args)
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()
            with open(failure_file, encoding="utf-8", errors="replace") as f:
                message = f.read().strip()
            code = failure.exitcode if isinstance(failure.exitcode, int) and 0 < failure.exitcode < 256 else 1
            said = re.match(r"rank (\d+): error: (.*)", message)
            if said:  # "rank 1: error: X" -> "error: X (rank 1)"
                message = f"{said.group(2)} (rank {said.group(1)})"
            print(f"error: {message or f'rank {rank} failed with exit code {failure.exitcode} (see its output above)'}",
                  file=sys.stderr)
            return code
        return 0
    finally:
        with contextlib.suppress(OSError):
            os.unlink(failure_file)


if __name__ == "__main__":
    sys.exit(main())
