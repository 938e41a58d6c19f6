"""Process-group start-up from torchrun's environment, and a guard that stops every rank when one fails.

A rank that raises inside a collective program leaves the others blocked in their next collective until
the backend's timeout (minutes). `RankGuard` bounds that: the failing rank writes its message to the
rendezvous store, and a watchdog thread on every rank polls the store; on seeing a failure it prints the
failing rank's message and exits the process with a non-zero code. Each rank also publishes a heartbeat
counter; a rank whose counter stops moving for `dead_after_s` (killed, segfaulted) is reported the same
way, so every rank exits within a bounded time whatever happened.

The guard talks to the store over its own connection (`DistContext.guard_store`). A TCPStore client
serves one request at a time, and the process group blocks in `store.wait` on its connection while it
connects to its peers (`new_group` waits there, with no timeout, for a rank that died): a watchdog
sharing that connection would block behind it and never notice the dead peer.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType

import torch
import torch.distributed as dist

from cost_models.errors import PlannerError, internal_error_line
from layers3d.inflight import InFlight, in_flight

__all__ = ["DistContext", "LaunchError", "init_distributed", "distributed", "RankGuard", "FAILED_KEY", "DEAD_AFTER_S",
           "BACKEND_GRACE_S"]

FAILED_KEY = "failed"  # the run's first failure: "<exit status>|<message>" (every rank exits with that status)
# Heartbeat silence after which a rank counts as dead. A killed rank is found within this plus two polls
# (the acceptance bound is 60 s for every rank to exit); a live rank's watchdog thread beats every poll
# even while its main thread runs torch ops or waits in a collective, which release the GIL.
DEAD_AFTER_S = 20.0
# The process group's own timeout is the guard's deadline plus this, so that the guard, which can name the
# collective and the missing peers, is the one that stops a stuck run.
BACKEND_GRACE_S = 30.0
# How long one request of the guard's own store connection may block (the store's host gone or hung).
_GUARD_STORE_TIMEOUT_S = 30.0


class LaunchError(PlannerError, ValueError):
    """The process was not started the way a distributed command needs (missing torchrun variables)."""


@dataclass
class DistContext:
    """What one rank knows after start-up."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    store: dist.Store
    """The store the process group rendezvoused through (prefixed for this run)."""
    guard_store: dist.Store
    """The same store over a connection of its own, for `RankGuard` (see the module docstring)."""


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None or not value.lstrip("-").isdigit():
        raise LaunchError(f"environment variable {name} is {value!r}; start this command with "
                          "`torchrun --standalone --nproc-per-node N -m planner ...`")
    return int(value)


def init_distributed(timeout_s: float = 300.0, backend: str | None = None) -> DistContext:
    """Initialise the default process group from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT): NCCL with one GPU per local rank when CUDA is available, else gloo.

    The store is created here (as `env://` would: a client of torchrun's agent store, or hosted by rank 0
    when no agent runs) so that `RankGuard` can use it too. Collectives time out after `timeout_s`.
    """
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local = int(os.environ.get("LOCAL_RANK", rank))
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = _env_int("MASTER_PORT")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", local % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(host, port, world, is_master=(rank == 0 and not agent),
                          timeout=timedelta(seconds=timeout_s), multi_tenant=True)
    run = os.environ.get("TORCHELASTIC_RUN_ID", "") + "/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"planner/{run}/"
    store = dist.PrefixStore(prefix, store)
    dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    # The store's server is up (every rank has joined the group): a second client connection for the guard.
    own = dist.TCPStore(host, port, world, is_master=False,
                        timeout=timedelta(seconds=min(timeout_s, _GUARD_STORE_TIMEOUT_S)))
    guard_store = dist.PrefixStore(prefix + "guard/", own)
    return DistContext(rank, world, local, device, backend, store, guard_store)


@contextmanager
def distributed(timeout_s: float = 300.0, *, backend: str | None = None, debug: bool = False,
                poll_s: float = 0.5, dead_after_s: float = DEAD_AFTER_S) -> Iterator[DistContext]:
    """Run a training script's ranks the way `planner verify` runs its own: start the process group from
    torchrun's environment, and guard the block (`RankGuard`).

        with planner.distributed(timeout_s=300) as ctx:
            model = planner.apply_plan(model, planner.Plan.load("plan.json"))
            ...  # train

    Inside the block, a rank that raises stops every rank with its message (one line for a PlannerError),
    a rank that dies is named by the others within `dead_after_s`, and a rank that waits in one of the
    package's collectives longer than `timeout_s` stops the run naming that collective and the ranks that
    are not in it. Every rank then exits with the first failure's status. The process group is destroyed
    when the block ends normally.
    """
    if not timeout_s > 0:
        raise LaunchError(f"timeout_s must be a positive number of seconds, got {timeout_s}")
    ctx = init_distributed(timeout_s=timeout_s + BACKEND_GRACE_S, backend=backend)
    with RankGuard(ctx.guard_store, ctx.rank, ctx.world_size, debug=debug, deadline_s=timeout_s, poll_s=poll_s,
                   dead_after_s=dead_after_s):
        yield ctx
    if dist.is_initialized():
        dist.destroy_process_group()


class RankGuard:
    """Context manager: an exception inside it, or a failure or silence of another rank, ends this
    process with exit code `exit_code` after printing which rank failed and why.

    store: a store all ranks share, over a connection nothing else blocks on (`DistContext.guard_store`);
    poll_s: watchdog period; dead_after_s: heartbeat silence after which another rank counts as dead. `exit`
    is `os._exit` by default: a clean interpreter exit could block in a process group's destructor while a
    peer is stuck in a collective. An exception that is not a PlannerError is a bug: one line, and its
    traceback on this rank's stderr with `debug`. deadline_s: how long this rank may wait in one collective
    (`layers3d.inflight`); past it, the run stops with the collective and the peers missing from it named.
    """

    def __init__(self, store: dist.Store, rank: int, world_size: int, *, poll_s: float = 0.5,
                 dead_after_s: float = DEAD_AFTER_S, exit_code: int = 1,
                 exit: Callable[[int], None] = os._exit, debug: bool = False,
                 deadline_s: float | None = None) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.debug, self.deadline_s = debug, deadline_s
        self.poll_s, self.dead_after_s, self.exit_code = poll_s, dead_after_s, exit_code
        self._exit = exit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"rank-guard-{rank}", daemon=True)
        self._beat = 0

    # --- the failing side ----------------------------------------------------------------------
    def fail(self, message: str, *, grace_s: float = 2.0, code: int | None = None) -> None:
        """Publish `message` as this rank's failure and exit.

        This rank's error is often only a symptom (a collective whose peer closed its connection), so
        for `grace_s` it waits for another rank's published failure and prints that as the cause. If
        none comes, ranks whose heartbeat stood still during the wait (killed, crashed) are named as
        the likely cause. The first failure published wins on every rank.
        """
        text = f"rank {self.rank}: {message}"
        code = self.exit_code if code is None else code
        cause = None
        try:
            before = self._beats()
            deadline = time.monotonic() + max(grace_s, 3 * self.poll_s)
            while cause is None and time.monotonic() < deadline:
                if self.store.check([FAILED_KEY]):
                    code, cause = _read_failure(self.store)
                else:
                    time.sleep(0.05)
            if cause is None:
                after = self._beats()
                silent = [r for r in before if r != self.rank and before[r] == after.get(r)
                          and not self.store.check([f"done/{r}"])]
                if silent:
                    last = message.splitlines()[-1] if message else ""
                    text = (f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} stopped "
                            f"responding (killed or crashed); rank {self.rank} saw: {last}")
                code, cause = _publish(self.store, code, text)
        except Exception:  # noqa: BLE001 - the store itself may be gone; still exit
            cause = text
        self._stop.set()
        _note_failure(cause)
        if cause != text:
            last = message.splitlines()[-1] if message else ""
            print(f"[planner] rank {self.rank} stopping because {cause}\n[planner] (rank {self.rank} saw: {last})",
                  file=sys.stderr, flush=True)
        else:
            print(f"[planner] {text}", file=sys.stderr, flush=True)
        # Stay up a few polls, so that every watchdog reads the cause before a launcher (torchrun) tears the
        # group down on this exit, or before the store goes away with rank 0 (no launcher).
        time.sleep(3 * self.poll_s)
        sys.stdout.flush()
        self._exit(code)

    def _beats(self) -> dict[int, int]:
        out = {}
        for r in range(self.world_size):
            key = f"beat/{r}"
            out[r] = int(self.store.get(key)) if self.store.check([key]) else -1
        return out

    # --- the watching side ---------------------------------------------------------------------
    def _watch(self) -> None:
        last_seen: dict[int, tuple[int, float]] = {}
        while not self._stop.wait(self.poll_s):
            try:
                self._beat += 1
                self.store.set(f"beat/{self.rank}", str(self._beat))
                cur = in_flight()
                self.store.set(f"at/{self.rank}", json.dumps([cur.key(), cur.describe()] if cur else None))
                if self.store.check([FAILED_KEY]):
                    self._stop_for(*reversed(_read_failure(self.store)))
                    return
                now = time.monotonic()
                if cur is not None and self.deadline_s is not None and now - cur.since > self.deadline_s:
                    self._publish_and_stop(self._overdue(cur))
                    return
                for r in range(self.world_size):
                    if self._stop.is_set():  # between store calls too: `__exit__` waits for this thread
                        return
                    if r == self.rank or self.store.check([f"done/{r}"]):
                        continue
                    beat = int(self.store.get(f"beat/{r}")) if self.store.check([f"beat/{r}"]) else -1
                    prev = last_seen.get(r)
                    if prev is None or prev[0] != beat:
                        last_seen[r] = (beat, now)
                    elif now - prev[1] > self.dead_after_s:
                        self._stop_for(f"rank {r} stopped responding (no heartbeat for {self.dead_after_s:.0f} s): "
                                       "it was killed or is hung")
                        return
            except Exception as e:  # noqa: BLE001 - a lost store means the launcher is gone
                if self._stop.is_set():
                    return
                self._stop_for(f"lost the rendezvous store ({type(e).__name__}: {e}); another rank or the "
                               "launcher has exited")
                return

    def _overdue(self, cur: InFlight) -> str:
        """Which collective this rank waits in past the deadline, and where each missing peer is instead."""
        peers = [r for r in (cur.ranks or range(self.world_size)) if r != self.rank]
        missing = []
        for r in peers:
            key = f"at/{r}"
            at = json.loads(self.store.get(key)) if self.store.check([key]) else None
            if at is None:
                missing.append(f"rank {r} is in no collective" if self.store.check([key]) else f"rank {r} never reported")
            elif at[0] != cur.key():
                missing.append(f"rank {r} is in {at[1]}")
        return (f"rank {self.rank} waited more than {self.deadline_s:g} s in {cur.describe()}; "
                + ("; ".join(missing) if missing else "every peer is in it too (the backend is stuck)")
                + " (the ranks run different collective programs, or a peer is stuck)")

    def _publish_and_stop(self, text: str) -> None:
        """Publish `text` as the run's failure (unless another came first) and stop with the first one."""
        code = self.exit_code
        try:
            code, cause = _publish(self.store, code, text)
        except Exception:  # noqa: BLE001 - the store may be gone
            cause = text
        self._stop_for(cause, code)

    def _stop_for(self, message: str, code: int | None = None) -> None:
        _note_failure(message)
        print(f"[planner] rank {self.rank} stopping: {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Stay up a few polls: without a launcher's store, rank 0 hosts it, and the other ranks must still
        # be able to read the cause from it.
        time.sleep(3 * self.poll_s)
        self._exit(self.exit_code if code is None else code)

    # --- context -------------------------------------------------------------------------------
    def __enter__(self) -> RankGuard:
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(ev, PlannerError):  # a user error: one line, the command line's exit status for it
            self.fail(f"error: {type(ev).__name__}: {' '.join(str(ev).split())}", code=getattr(ev, "exit_code", 2))
        elif ev is not None and not isinstance(ev, SystemExit | KeyboardInterrupt):  # a bug: the traceback on --debug
            if self.debug:
                traceback.print_exception(et, ev, tb, file=sys.stderr)
            self.fail(internal_error_line(ev))
        try:
            self.store.set(f"done/{self.rank}", "1")
        finally:
            self._stop.set()
            # The watchdog must be out of the store before the interpreter shuts down: a daemon thread that
            # returns from a store call during shutdown aborts the process (SIGABRT: the binding's re-taking
            # of the GIL ends the thread inside a noexcept destructor). It checks the flag between calls,
            # and the store's own timeout bounds each call.
            self._thread.join(timeout=self.store.timeout.total_seconds() + self.poll_s)


def _publish(store: dist.Store, code: int, text: str) -> tuple[int, str]:
    """Publish this failure unless one was published first; the run's failure, (exit status, message)."""
    mine = f"{code}|{text}"
    first = store.compare_set(FAILED_KEY, "", mine).decode(errors="replace") or mine
    return _parse_failure(first)


def _read_failure(store: dist.Store) -> tuple[int, str]:
    return _parse_failure(store.get(FAILED_KEY).decode(errors="replace"))


def _parse_failure(value: str) -> tuple[int, str]:
    status, sep, text = value.partition("|")
    return (int(status), text) if sep and status.isdigit() else (1, value)


def _note_failure(message: str) -> None:
    """Write the run's failure to $PLANNER_FAILURE_FILE (set by `planner.launch`), unless a rank did already,
    so the launcher can print it as its last line."""
    path = os.environ.get("PLANNER_FAILURE_FILE")
    if not path:
        return
    try:
        with open(path, "r+", encoding="utf-8") as f:
            if not f.read():
                f.write(message.strip().splitlines()[0] if message.strip() else message)
    except OSError:
        pass
