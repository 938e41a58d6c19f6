"""Fork-based harness for distributed tests on CPUs: N gloo ranks on 127.0.0.1.

`run_ranks(fn, world_size, timeout_s, args)` forks `world_size` ranks with
torch.multiprocessing.start_processes(start_method="fork"); each initialises a gloo process group, runs
`fn(rank, *args)` and sends its return value back as bytes (torch.save). If any rank raises, the others
are stopped and `RankError` reports every failed rank's traceback (the earliest first: the root cause;
later ones are usually peers losing their connection). A global timeout kills all ranks, so a hang fails
the test instead of hanging CI.
"""

from __future__ import annotations

import gc
import importlib
import io
import os
import pickle
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ports import free_port

__all__ = ["run_ranks", "RankError", "RankTimeout"]


class RankError(RuntimeError):
    """One or more ranks raised. `errors` maps rank -> (exception or None, traceback text), earliest
    failure first; `first` is the root-cause exception when it could be pickled."""

    def __init__(self, errors: dict[int, tuple[BaseException | None, str]]) -> None:
        self.errors = errors
        self.first = next(iter(errors.values()))[0] if errors else None
        parts = [f"--- rank {r} ---\n{tb}" for r, (_, tb) in errors.items()]
        super().__init__(f"{len(errors)} rank(s) failed:\n" + "\n".join(parts))


class RankTimeout(RankError):
    """The ranks did not finish within the timeout; all were killed."""

    def __init__(self, timeout_s: float, running: list[int], errors: dict[int, tuple[BaseException | None, str]]) -> None:
        super().__init__(errors)
        self.args = (f"ranks {running} still running after {timeout_s} s and were killed\n" + self.args[0],)


def _free_port() -> int:
    return free_port()  # (a name of its own: a test hands the harness a taken port through it)


def _child(rank: int, fn: Callable[..., Any], world_size: int, port: int, tmp: str, timeout_s: float,
           args: tuple) -> None:
    torch.set_num_threads(1)
    stage = "init"
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        stage = "run"
        result = fn(rank, *args)
        buf = io.BytesIO()
        torch.save(result, buf)
        with open(os.path.join(tmp, f"result_{rank}.pt"), "wb") as f:
            f.write(buf.getvalue())
    except BaseException as e:
        tb = traceback.format_exc()
        try:
            payload = pickle.dumps((e, tb, stage))
        except Exception:
            payload = pickle.dumps((None, tb, stage))
        path = os.path.join(tmp, f"error_{rank}.pkl")
        with open(path + ".part", "wb") as f:
            f.write(payload)
        os.replace(path + ".part", path)
        os._exit(1)  # do not run gloo teardown against peers that may be gone
    dist.destroy_process_group()


class _RendezvousFailed(Exception):
    """The ranks could not meet (typically: another process took the free port first), or the first rank
    to fail lost a loopback connection inside gloo's transport (`_TRANSPORT_LOST`) rather than raising in
    the test's own code; worth a retry on fresh ranks."""

    def __init__(self, errors: dict[int, tuple[BaseException | None, str]]) -> None:
        super().__init__("rendezvous failed")
        self.errors = errors


# gloo's words for a peer's socket closing under it. On a loaded 2-core CI machine a rank building a group
# (dist.new_group's connectFullMesh) saw this once with no other rank reporting an error: no test code had
# failed. Where the root cause is a test's own error, that error is the earliest and nothing is retried.
_TRANSPORT_LOST = ("Gloo connectFullMesh failed", "Connection closed by peer", "Connection reset by peer")


def _read_errors(tmp: str, world_size: int) -> dict[int, tuple[BaseException | None, str]]:
    found = []
    for r in range(world_size):
        path = os.path.join(tmp, f"error_{r}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as f:
                exc, tb, stage = pickle.load(f)
            found.append((os.path.getmtime(path), r, exc, tb, stage))
    found.sort(key=lambda x: (x[0], x[1]))
    errors = {r: (exc, tb) for _, r, exc, tb, _ in found}
    if found and (found[0][4] == "init" or _lost_connection(found[0][3])):
        raise _RendezvousFailed(errors)
    return errors


def _lost_connection(tb: str) -> bool:
    """The traceback ends in gloo losing a connection (its last line names one of `_TRANSPORT_LOST`)."""
    last = tb.strip().splitlines()[-1] if tb.strip() else ""
    return any(words in last for words in _TRANSPORT_LOST)


def run_ranks(fn: Callable[..., Any], world_size: int = 8, timeout_s: float = 60, args: tuple = (),
              grace_s: float = 2.0) -> list[Any]:
    """Run `fn(rank, *args)` on `world_size` forked gloo ranks; return the per-rank results (rank order).

    Raises RankError when a rank raises (after giving the others `grace_s` seconds to report their own
    errors), RankTimeout after `timeout_s` seconds. A failed rendezvous (the free port taken by another
    process before rank 0 bound it), or a first failure that is gloo losing a loopback connection, is
    retried on new ranks with a new port, up to 3 attempts.
    """
    torch.set_num_threads(1)  # forked children deadlock in OpenMP if the parent already ran threaded ops
    # torch.utils.checkpoint imports torch._dynamo (~800 modules) on first use: import it once here rather
    # than in every forked rank (8 ranks on 2 cores would take ~8 s).
    importlib.import_module("torch._dynamo")
    for attempt in range(_ATTEMPTS):
        tmp = tempfile.mkdtemp(prefix="layers3d_ranks_")
        try:
            return _run_once(fn, world_size, timeout_s, args, grace_s, tmp)
        except _RendezvousFailed as e:
            if attempt == _ATTEMPTS - 1:
                raise RankError(e.errors) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise AssertionError("unreachable")


_ATTEMPTS = 3


def _run_once(fn: Callable[..., Any], world_size: int, timeout_s: float, args: tuple, grace_s: float,
              tmp: str) -> list[Any]:
    # The ranks inherit this process's heap (pytest's, with every traced model and plan of the session):
    # frozen, the ranks' garbage collections skip it (measuring memory calls gc.collect(), which took ~1 s
    # per call per rank over that heap) and do not touch, and so copy, its pages.
    gc.freeze()
    try:
        ctx = mp.start_processes(_child, args=(fn, world_size, _free_port(), tmp, timeout_s, args),
                                 nprocs=world_size, join=False, start_method="fork")
    finally:
        gc.unfreeze()
    procs = ctx.processes
    deadline = time.monotonic() + timeout_s
    failed_at = None
    while True:
        codes = [p.exitcode for p in procs]
        if all(c == 0 for c in codes):
            break
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        now = time.monotonic()
        if failed_at is not None and (all(c is not None for c in codes) or now - failed_at > grace_s):
            _kill(procs)
            errors = _read_errors(tmp, world_size)
            if not errors:
                errors = {r: (None, f"exited with code {c}") for r, c in enumerate(codes) if c not in (None, 0)}
            raise RankError(errors)
        if now > deadline:
            running = [r for r, c in enumerate(codes) if c is None]
            _kill(procs)
            raise RankTimeout(timeout_s, running, _read_errors(tmp, world_size))
        time.sleep(0.02)
    results = []
    for r in range(world_size):
        with open(os.path.join(tmp, f"result_{r}.pt"), "rb") as f:
            results.append(torch.load(io.BytesIO(f.read()), weights_only=False))
    return results


def _kill(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5)
