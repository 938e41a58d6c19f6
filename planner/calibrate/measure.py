"""Timing collectives, matmuls and copies on the real cluster, for `planner calibrate`.

Every function here is called on every rank of an initialised process group, in the same order, and
returns the same numbers on every rank: each decision that changes what runs next is taken on values
reduced over the world, so ranks never disagree about which collective comes next.

What is timed: the communicator groups the planner's strategies use are groups over any set of mesh axes
of the candidate meshes; a hardware profile prices them by (link, collective, group size), so by default
one representative group per (link, group size) is timed (`every=True`: every distinct one). A point (one
collective, one message size) is timed in batches of back-to-back calls after a barrier over the whole
world, so that every group of the partition communicates at the same time, as in a training step; see
`_time_point` and `time_series` for the statistics.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import combinations

import torch
import torch.distributed as dist

from cost_models.mesh import Mesh
from layers3d.inflight import tracked
from planner.calibrate.fit import Sample

__all__ = ["AxisGroups", "Series", "axis_groups", "time_series", "measure_matmul_flops",
           "measure_copy_bandwidth", "world_max"]

# Lowest number of message sizes per series: the fit of two unknowns needs a third point to be checked.
MIN_POINTS = 3
# Back-to-back calls per timed batch: enough to last about BATCH_TARGET_S, at most MAX_BATCH.
BATCH_TARGET_S = 0.01
MAX_BATCH = 16
# Most passes over the points while the time budget lasts.
MAX_PASSES = 9
# Most extra passes over the points of a series whose fit falls short (see `time_series`).
MAX_RETRIES = 6


# torch 2.13 renamed the single-tensor collectives (the old names warn); older releases have only the old.
_ALL_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


@dataclass(frozen=True)
class AxisGroups:
    """The communicators over a set of mesh axes: `groups` partitions the world into groups of n ranks."""

    label: str
    mesh: Mesh
    axes: tuple[str, ...]
    link: str  # "intra" or "inter"
    groups: tuple[tuple[int, ...], ...]

    @property
    def n(self) -> int:
        return len(self.groups[0])


@dataclass
class Series:
    """The measured points of one collective kind on one set of communicator groups."""

    axis: AxisGroups
    kind: str
    samples: list[Sample] = field(default_factory=list)
    stopped: str = ""  # why the sizes stopped growing
    retries: int = 0  # extra passes over this series' sizes because its fit fell short


def axis_groups(meshes: Sequence[Mesh], every: bool = False) -> list[AxisGroups]:
    """The communicator groups to time: over every non-empty set of mesh axes (in mesh order, fewest
    axes first) of every mesh, skipping partitions seen before; without `every`, only the first group
    of each (link, group size), which is all a hardware profile can tell apart."""
    seen: set[frozenset[tuple[int, ...]]] = set()
    sizes: set[tuple[str, int]] = set()
    out: list[AxisGroups] = []
    for mesh in meshes:
        names = [a for a in mesh.axis_names if mesh.axis_size(a) > 1]
        for count in range(1, len(names) + 1):
            for axes in combinations(names, count):
                groups = tuple(tuple(g) for g in mesh.groups(axes))
                link = "intra" if mesh.is_intra_node(axes) else "inter"
                key = frozenset(groups)
                if key in seen or (not every and (link, len(groups[0])) in sizes):
                    continue
                seen.add(key)
                sizes.add((link, len(groups[0])))
                out.append(AxisGroups(f"{mesh} axes {''.join(axes)}", mesh, axes, link, groups))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def world_max(values: Sequence[float], device: torch.device) -> list[float]:
    """Element-wise maximum of `values` over all ranks."""
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    with tracked("all_reduce", (), "calibrate: the slowest rank's time"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _collective(kind: str, group: dist.ProcessGroup, ranks: tuple[int, ...], numel: int,
                device: torch.device) -> Callable[[], None]:
    """A closure running one `kind` collective over `group` on preallocated float32 buffers of `numel`
    elements (the bytes-convention buffer: gathered output, unreduced input, local tensor)."""
    n = len(ranks)
    full = torch.zeros(numel, dtype=torch.float32, device=device)  # zeros: repeated sums never overflow
    if kind == "all_gather":
        shard = torch.zeros(numel // n, dtype=torch.float32, device=device)
        return lambda: _ALL_GATHER(full, shard, group=group)
    if kind == "reduce_scatter":
        shard = torch.zeros(numel // n, dtype=torch.float32, device=device)
        return lambda: _REDUCE_SCATTER(shard, full, group=group)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if kind == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, src=ranks[0], group=group)
    raise ValueError(f"unknown collective kind {kind!r}")


def _batch_size(seconds_per_call: float) -> int:
    return max(1, min(MAX_BATCH, round(BATCH_TARGET_S / max(seconds_per_call, 1e-9))))


def _time_point(op: Callable[[], None], warmup: int, reps: int, batch: int | None,
                device: torch.device) -> tuple[list[float], int]:
    """Time `reps` batches of `batch` back-to-back calls of `op` after one common world barrier.

    Returns (this rank's seconds per call in each batch, the batch size). Batching averages the
    scheduler's jitter over several calls. The first call is never timed (lazy buffer and connection
    set-up). Without `batch` (no earlier size to predict from), `warmup` calls estimate the call time, the
    slowest rank's estimate sets the batch so that it lasts about BATCH_TARGET_S on every rank.
    """
    op()
    _sync(device)
    if batch is None:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(warmup):
            op()
        _sync(device)
        batch = _batch_size(world_max([(time.perf_counter() - t0) / max(warmup, 1)], device)[0]) if warmup else 1
    dist.barrier()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(batch):
            op()
        _sync(device)
        times.append((time.perf_counter() - t0) / batch)
    return times, batch


@dataclass
class _Point:
    series: Series
    numel: int
    batch: int | None = None
    cost: float = 0.0  # slowest rank's wall seconds over every pass
    median: float = 0.0  # slowest rank's median seconds per call
    times: list[float] = field(default_factory=list)  # this rank's, over every pass


def _next_call(points: list[_Point], growth: int) -> float:
    """Expected seconds per call of a series' next size (`growth` times its last): linear in bytes through
    its last two points (alpha-beta), clamped to [1, growth] x the last point's time."""
    last = points[-1]
    if len(points) < 2:
        return last.median * growth
    slope = max(last.median - points[-2].median, 0.0) / max(last.numel - points[-2].numel, 1)
    return min(max(last.median + slope * last.numel * (growth - 1), last.median), last.median * growth)


def time_series(axes: Sequence[AxisGroups], kinds: Sequence[str], *, min_bytes: int, max_bytes: int,
                growth: int, warmup: int, reps: int, passes: int, budget_s: float, timeout_s: float,
                device: torch.device, needs_more: Callable[[Series], bool] | None = None,
                retry_budget_s: float = 0.0) -> tuple[list[Series], int]:
    """Time every collective of `kinds` on every group set of `axes` over geometric message sizes.

    Sizes start at `min_bytes` and grow by `growth` up to `max_bytes`, rounded up to a multiple of 4 * n
    bytes so every rank holds an equal float32 shard. Each pass times every point with ceil(reps / passes)
    batches. The first pass finds the sizes: all series advance together, one size at a time; at each size
    the series whose next size is expected to cost least go on while `passes` passes over their next sizes
    fit in what is left of `budget_s`, the others stop growing (every series gets at least MIN_POINTS
    sizes). Later passes revisit all
    points, alternating reverse and forward order, at least `passes` in all and more while the budget
    lasts (revisits are cheaper than the first visit): each point is sampled at moments spread over the
    run, so a burst of background load spoils one pass of a point, not the point. A point's time is the
    slowest rank's median over all its batches, since a step waits for the slowest group. Decisions use
    world-reduced numbers only, so every rank runs the same collectives in the same order.

    Then the retries: `needs_more(series)` looks at a series' samples (e.g. "its alpha-beta fit is poor");
    a series it flags on any rank gets one more pass over its sizes, and again after each pass while it is
    flagged, up to MAX_RETRIES, and while the retries have spent less than `retry_budget_s` (a round
    starts below it, so the budget can be exceeded by one pass over the flagged series). A burst of
    background load that spoiled a few points of one series is voted down by the extra batches instead
    of spoiling its fit. Returns the series (samples set, `retries` counted) and the number of full passes.
    """
    rank = dist.get_rank()
    comms = []
    for axis in axes:
        mine, _ = dist.new_subgroups_by_enumeration([list(g) for g in axis.groups],
                                                    timeout=timedelta(seconds=timeout_s))
        comms.append((mine, next(g for g in axis.groups if rank in g)))
    series = [Series(axis, kind) for axis in axes for kind in kinds]
    comm_of = {id(s): comms[axes.index(s.axis)] for s in series}
    per_pass = -(-reps // passes)

    def measure(pt: _Point) -> float:
        t0 = time.perf_counter()
        group, ranks = comm_of[id(pt.series)]
        op = _collective(pt.series.kind, group, ranks, pt.numel, device)
        # One tracked block per point (its barriers are world-wide): every rank measures the same points in
        # the same order, so a rank waiting past the guard's deadline names the point and the missing peers.
        with tracked(pt.series.kind, (), f"calibrate {pt.numel * 4} B over {','.join(map(str, ranks))}"):
            times, pt.batch = _time_point(op, warmup, per_pass, pt.batch, device)
        pt.times.extend(times)
        return time.perf_counter() - t0

    points: list[_Point] = []
    own: dict[int, list[_Point]] = {id(s): [] for s in series}
    active, spent, nbytes = list(series), 0.0, min_bytes
    while active:
        level = []
        for s in active:
            pt = _Point(s, -(-nbytes // (4 * s.axis.n)) * s.axis.n)
            if own[id(s)]:  # batch from the predicted call time: no warm-up round needed
                pt.batch = _batch_size(_next_call(own[id(s)], growth))
            level.append(pt)
        local_cost = [measure(pt) for pt in level]
        reduced = world_max(local_cost + [statistics.median(pt.times) for pt in level], device)
        for i, pt in enumerate(level):
            pt.cost, pt.median = reduced[i], reduced[len(level) + i]
            spent += pt.cost
            points.append(pt)
            own[id(pt.series)].append(pt)
        if nbytes * growth > max_bytes:
            for s in active:
                s.stopped = "max bytes"
            break
        # Cheapest next sizes first, while `passes` passes over them fit in what is left of the budget.
        left = budget_s - passes * spent
        expected = {id(s): own[id(s)][-1].cost * _next_call(own[id(s)], growth) / max(own[id(s)][-1].median, 1e-12)
                    for s in active}
        for s in sorted(active, key=lambda s: expected[id(s)]):
            if len(own[id(s)]) < MIN_POINTS or passes * expected[id(s)] <= left:
                left -= passes * expected[id(s)]
            else:
                s.stopped = "time budget"
        active = [s for s in active if not s.stopped]
        nbytes *= growth
    done, last = 1, 0.0
    while done < passes or (done < MAX_PASSES and spent + last <= budget_s):
        local = sum(measure(pt) for pt in (reversed(points) if done % 2 else points))
        last = world_max([local], device)[0]
        spent += last
        done += 1
    _set_samples(series, points, device)
    spent, rounds = 0.0, 0
    while needs_more is not None and spent < retry_budget_s:
        flagged = world_max([float(s.retries < MAX_RETRIES and needs_more(s)) for s in series], device)
        again = {id(s) for s, flag in zip(series, flagged) if flag}
        if not again:
            break
        order = reversed(points) if (done + rounds) % 2 else points
        local = sum(measure(pt) for pt in order if id(pt.series) in again)
        spent += world_max([local], device)[0]
        rounds += 1
        for s in series:
            s.retries += id(s) in again
        _set_samples(series, points, device)
    return series, done


def _set_samples(series: Sequence[Series], points: Sequence[_Point], device: torch.device) -> None:
    """Each series' samples from its points' batches so far: per size, the slowest rank's median."""
    medians = world_max([statistics.median(pt.times) for pt in points], device)
    for s in series:
        s.samples = []
    for pt, seconds in zip(points, medians):
        pt.series.samples.append(Sample(pt.series.kind, pt.series.axis.n, pt.numel * 4, seconds))


def _concurrent_rate(work: Callable[[], None], units_per_call: float, device: torch.device,
                     min_seconds: float) -> float:
    """Units per second one rank achieves running `work` while every rank runs it at the same time.

    The number of calls is fixed from the slowest rank's estimate, so every rank does the same work;
    the time is from a common barrier to the last rank's end, which is what a training step sees when
    ranks share a host (8 gloo ranks on 2 cores) and the plain per-device rate on GPUs.
    """
    work()
    _sync(device)
    t0 = time.perf_counter()
    work()
    _sync(device)
    estimate = world_max([time.perf_counter() - t0], device)[0]
    calls = max(3, math.ceil(min_seconds / max(estimate, 1e-9)))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        work()
    _sync(device)
    elapsed = world_max([time.perf_counter() - t0], device)[0]
    return units_per_call * calls / elapsed


def measure_matmul_flops(dtype: torch.dtype, device: torch.device, size: int, min_seconds: float) -> float:
    """Achieved FLOP/s of one rank multiplying two size x size matrices while every rank does the same."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    return _concurrent_rate(lambda: torch.mm(a, b, out=out), 2.0 * size**3, device, min_seconds)


def measure_copy_bandwidth(nbytes: int, device: torch.device, min_seconds: float) -> float:
    """Achieved memory bandwidth of one rank (bytes read + written per second) copying an `nbytes` buffer
    while every rank does the same."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return _concurrent_rate(lambda: dst.copy_(src), 2.0 * src.numel() * 4, device, min_seconds)
