"""Ranks agree before they talk: a check, over the rendezvous store, that every rank is about to run the
same collective program.

Ranks that load different plans, build different models or get inputs of other shapes issue different
collectives; the first mismatched one blocks (or deadlocks) and the run hangs. So `apply_plan`, `planner
verify` and `planner calibrate` first publish what shapes their collectives (the plan's digest, the
model's parameter shapes, the input shapes and dtypes, the world size, the command's own settings) in the
store, wait for every rank's entry and compare: a difference is one `RankMismatchError` on every rank
that names the ranks on each side and what differs. No collective runs before the check, and the check
itself uses only the store, so it cannot be caught in a mismatched collective. A rank that does not
arrive within `timeout_s` is named as missing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cost_models.errors import PlannerError
from layers3d.inflight import tracked

__all__ = ["AGREE_TIMEOUT_S", "RankMismatchError", "agree", "model_digest", "inputs_digest", "plan_digest",
           "text_digest"]

AGREE_TIMEOUT_S = 300.0  # how long a rank waits for the others to arrive (they may capture a big model first)
_calls = itertools.count()  # every rank numbers its agreements the same way: the n-th one meets the n-th one


class RankMismatchError(PlannerError, ValueError):
    """The ranks disagree on something that shapes their collectives, or one did not arrive."""


def text_digest(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()[:12]


def model_digest(model: nn.Module) -> str:
    """The model's class and every parameter's and buffer's name, shape and dtype (not its values): what a
    model config changes."""
    parts = [type(model).__qualname__]
    for kind, items in (("p", model.named_parameters()), ("b", model.named_buffers())):
        parts += [f"{kind}:{n}:{tuple(t.shape)}:{t.dtype}" for n, t in items]
    return f"{type(model).__name__} {text_digest(chr(10).join(parts))}"


def inputs_digest(inputs: Any) -> str:
    """Names (or positions), shapes and dtypes of the tensor inputs, readable."""
    items = inputs.items() if isinstance(inputs, Mapping) else enumerate(
        inputs if isinstance(inputs, tuple | list) else (inputs,))
    shown = [f"{k} {list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for k, t in items
             if isinstance(t, torch.Tensor)]
    return ", ".join(shown) or "no tensor inputs"


def plan_digest(plan: Any) -> str:
    """A `planner.plans.format.Plan`'s JSON digest, with its mesh and schemes to read."""
    from collections import Counter

    from planner.plans.json_io import format_json

    schemes = Counter(a.scheme for a in plan.assignments if a.scheme != "follow")
    shown = ", ".join(f"{s} x{n}" for s, n in schemes.most_common(3)) or "no planned ops"
    data = plan.to_dict()
    # How long the solve took is not part of what runs: ranks that each planned the same model (in their own
    # script) hold equal plans with different solve times.
    data.get("solver", {}).pop("seconds", None)
    return f"{text_digest(format_json(data))} (mesh {plan.mesh}, {shown})"


def _ranks(ranks: list[int]) -> str:
    """"rank 3" / "ranks 0-2" / "ranks 0, 2"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def agree(facts: Mapping[str, str], what: str, *, timeout_s: float = AGREE_TIMEOUT_S) -> None:
    """Raise RankMismatchError on every rank unless all ranks of the default process group pass equal
    `facts` (name -> short readable value) within `timeout_s`. Call it on every rank, before the first
    collective that depends on the facts."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return
    store = dist.distributed_c10d._get_default_store()
    prefix = f"planner/agree/{next(_calls)}/"
    keys = [f"{prefix}{r}" for r in range(world)]
    store.set(keys[rank], json.dumps(dict(facts), sort_keys=True))
    with tracked("agree", (), what):
        try:
            store.wait(keys, timedelta(seconds=timeout_s))
        except Exception:  # noqa: BLE001 - a timeout (DistStoreError) or a store that went away
            missing = [r for r in range(world) if not _has(store, keys[r])]
            raise RankMismatchError(
                f"{_ranks(missing) if missing else 'some ranks'} did not reach {what} within {timeout_s:g} s "
                f"(they failed or hang before it; see their output); rank {rank} stops") from None
    seen = [json.loads(store.get(k)) for k in keys]
    diffs = []
    for name in sorted(set().union(*seen)):
        sides: dict[str, list[int]] = {}
        for r, f in enumerate(seen):
            sides.setdefault(str(f.get(name, "(not given)")), []).append(r)
        if len(sides) > 1:
            diffs.append(f"{name}: " + "; ".join(f"{_ranks(rs)} {v}" for v, rs in
                                                  sorted(sides.items(), key=lambda kv: kv[1][0])))
    if diffs:
        # every rank read every rank's facts before any leaves: the store lives in rank 0's process, and a rank that
        # raised and exited first left the others a closed connection instead of this message (seen under load)
        done = [f"{prefix}read/{r}" for r in range(world)]
        store.set(done[rank], "1")
        try:
            store.wait(done, timedelta(seconds=timeout_s))
        except Exception:  # noqa: BLE001 - a rank gone since: the message below is still this rank's
            pass
        raise RankMismatchError(f"the ranks disagree before {what}, so their collectives would not match: "
                                + " | ".join(diffs) + ". Give every rank the same plan file, model and inputs")


def _has(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:  # noqa: BLE001
        return False
