"""Running `planner calibrate`: set up the process group, measure, fit, and write the profile.

`calibrate(config)` measures (on every rank, identical results everywhere); `fit_calibration` fits alpha
and beta per (link, collective, group size), per (link, collective) over all group sizes and per link over
all collectives, which is what a HardwareProfile stores; `build_profile` turns the base profile and the
measurements into the calibrated profile (a pure function of its inputs); `run` does all of it and has
rank 0 write the file.
"""

from __future__ import annotations

import csv
import io
import os
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TextIO

import torch
import torch.distributed as dist

from cost_models.files import write_atomic
from cost_models.hardware import LINKS, PEAK_DTYPES, HardwareProfile, load_profile
from cost_models.mesh import candidate_meshes
from cost_models.redistribution import COLLECTIVE_KINDS
from planner.calibrate.config import CalibrateConfig, CalibrateError
from planner.calibrate.fit import MIN_BETA, Fit, FitError, Sample, fit_alpha_beta, format_fit_table
from planner.calibrate.measure import (
    Series,
    axis_groups,
    measure_copy_bandwidth,
    measure_matmul_flops,
    time_series,
)

__all__ = ["Calibration", "FitRow", "calibrate", "fit_calibration", "build_profile", "run", "write_samples",
           "broadcast_algorithm"]

# A series whose fit has R^2 below this is timed again (within --retry-budget); one still below it after
# that is flagged in the output. The profile is written either way; the warning says which numbers to
# distrust.
R2_WARNING = 0.9
# Matmul side and copy size: large enough for the device's full rate, small enough for a second of work
# with every rank busy (8192^3 bf16 is ~1 TFLOP: a few ms on an A100/H100; 512^3 fp32 is ~10 ms of one
# CPU core shared by four ranks).
GPU_MATMUL, CPU_MATMUL = 8192, 512
GPU_COPY_BYTES, CPU_COPY_BYTES = 2**30, 64 * 2**20
# A table row: (group label, collective, fit or None, note).
FitRow = tuple[str, str, "Fit | None", str]
# (link, kind, n): one group size; (link, kind): every group size of the link; (link, "*"): every kind.
FitKey = tuple


@dataclass
class Calibration:
    """Everything measured, identical on every rank."""

    world_size: int
    ranks_per_node: int
    device: str  # "cuda" or "cpu"
    device_name: str
    backend: str
    series: list[Series] = field(default_factory=list)
    matmul_flops: dict[str, float] = field(default_factory=dict)  # PEAK_DTYPES key -> FLOP/s per rank
    matmul_size: int = 0
    copy_bandwidth: float = 0.0  # bytes/s per rank (read + write)
    passes: int = 0  # passes made over the collective points
    device_count: int = 0  # GPUs on this node (0 on CPU)
    device_memory: int = 0  # bytes of one GPU (0 on CPU)
    seconds: float = 0.0


def _default_base(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu-gloo"
    name = torch.cuda.get_device_name(device)
    return "h100-80gb" if ("H100" in name or "H200" in name) else "a100-80gb"


def _init_process_group(timeout_s: float) -> bool:
    """Initialise torch.distributed from torchrun's environment (or as a single rank); True if created here."""
    if dist.is_initialized():
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                timeout=timedelta(seconds=timeout_s))
    return True


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _ranks_per_node(world: int) -> int:
    """Ranks on this node: torchrun's LOCAL_WORLD_SIZE, else (one host, e.g. forked test ranks) the world."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(local) if local.isdigit() and int(local) > 0 else world


def calibrate(config: CalibrateConfig) -> Calibration:
    """Measure collectives on every mesh axis, matmul FLOP/s and copy bandwidth.

    Call on every rank of an initialised process group; every rank returns the same Calibration.
    """
    t0 = time.perf_counter()
    device = _device()
    world = dist.get_world_size()
    rpn = _ranks_per_node(world)
    meshes = config.meshes if config.meshes is not None else tuple(candidate_meshes(world, rpn))
    for m in meshes:
        if m.world_size != world:
            raise CalibrateError(f"mesh {m} has {m.world_size} ranks but the process group has {world}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    cal = Calibration(world, rpn, device.type, name, dist.get_backend())
    bcast = broadcast_algorithm(cal.backend)
    cal.series, cal.passes = time_series(
        axis_groups(meshes, config.every_group), config.kinds, min_bytes=config.min_bytes,
        max_bytes=config.max_bytes, growth=config.growth, warmup=config.warmup, reps=config.reps,
        passes=config.passes, budget_s=config.time_budget_s, timeout_s=config.timeout_s, device=device,
        needs_more=lambda s: _poor_fit(s.samples, bcast), retry_budget_s=config.retry_budget_s)
    if device.type == "cuda":
        cal.device_count = torch.cuda.device_count()
        cal.device_memory = torch.cuda.get_device_properties(device).total_memory
        cal.matmul_size, dtypes = GPU_MATMUL, {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        copy_bytes = GPU_COPY_BYTES
    else:
        # CPU fp16 matmuls have no fast kernel (about 0.5 GFLOP/s): not measured, the base's number stays.
        cal.matmul_size, dtypes = CPU_MATMUL, {"fp32": torch.float32, "bf16": torch.bfloat16}
        copy_bytes = CPU_COPY_BYTES
    for key, dtype in dtypes.items():
        cal.matmul_flops[key] = measure_matmul_flops(dtype, device, cal.matmul_size, config.compute_seconds)
    cal.copy_bandwidth = measure_copy_bandwidth(copy_bytes, device, config.compute_seconds)
    cal.seconds = time.perf_counter() - t0
    return cal


def broadcast_algorithm(backend: str) -> str:
    """How `backend` broadcasts (cost_models.comm): gloo forwards the whole buffer along a binomial tree
    (gloo/broadcast.cc); NCCL and others are priced as pipelined."""
    return "binomial" if backend == "gloo" else "pipelined"


def _poor_fit(samples: list[Sample], broadcast: str) -> bool:
    """True when `samples` fit the cost model with R^2 below R2_WARNING (too few to fit: not poor, since
    timing them again would not add sizes)."""
    try:
        return fit_alpha_beta(samples, broadcast).r2 < R2_WARNING
    except FitError:
        return False


def _fit_row(label: str, kind: str, samples: list[Sample], note: str = "",
             broadcast: str = "pipelined") -> tuple[Fit | None, FitRow]:
    try:
        fit = fit_alpha_beta(samples, broadcast)
    except FitError as e:
        return None, (label, kind, None, f"{note}: {e}" if note else str(e))
    if fit.beta <= MIN_BETA:
        return None, (label, kind, fit, "no bandwidth signal: not written")
    return fit, (label, kind, fit, note)


def fit_calibration(cal: Calibration) -> tuple[dict[FitKey, Fit], list[FitRow]]:
    """Fit alpha and beta on the measured samples.

    Keys of the returned fits (what the profile stores): (link, kind, n) per group size; (link, kind), the
    fit of the largest group size timed on that link, for sizes not timed; (link, "*") pooled over every
    collective and size (the link's default, for collectives not timed). Sizes are not pooled per kind:
    one alpha and beta for every group size fits the ring formulas only where each size reaches the same
    bandwidth, and 8 gloo ranks on 2 cores do not (all-gather 0.16, 0.22, 0.29 GB/s over 2, 4, 8 ranks:
    pooled R^2 0.92 on a quiet machine, below 0.9 under load, per size >= 0.98); the largest size is the
    likeliest to behave like a larger one not timed. Table rows follow the same order (the (link, kind)
    keys have no rows of their own), then one row per mesh axis for group sizes timed on several axes
    (diagnosis: those axes are pooled in the rows above). Broadcasts are fitted on the formula of the
    backend's algorithm (`broadcast_algorithm`).
    """
    bcast = broadcast_algorithm(cal.backend)
    fits: dict[FitKey, Fit] = {}
    rows: list[FitRow] = []
    by_key: dict[FitKey, list[Sample]] = {}
    retries: dict[FitKey, int] = {}
    axes_of: dict[tuple[str, int], list[Series]] = {}
    for s in cal.series:
        for key in ((s.axis.link, s.kind, s.axis.n), (s.axis.link, "*")):
            by_key.setdefault(key, []).extend(s.samples)
        key = (s.axis.link, s.kind, s.axis.n)
        retries[key] = max(retries.get(key, 0), s.retries)
        axes_of.setdefault((s.axis.link, s.axis.n), []).append(s)
    kinds = list(dict.fromkeys(s.kind for s in cal.series))
    order = [key for link in LINKS for key in (
        [(link, kind, n) for n in sorted({s.axis.n for s in cal.series}, reverse=True) for kind in kinds]
        + [(link, "*")]) if key in by_key]
    for key in order:
        link, kind = key[0], key[1]
        label = f"{link} n={key[2]}" if len(key) == 3 else f"{link} any n"
        top = max(x.nbytes for x in by_key[key])
        note = f"<= {_size(top)}" + (f", {retries[key]} more passes" if retries.get(key) else "")
        if kind == "*":
            timed = {k for k in kinds if (link, k) in fits}
            note += ("; the link default, unused: every collective has its own fit" if timed == set(COLLECTIVE_KINDS)
                     else "; the link default, for collectives not timed")
        fit, row = _fit_row(label, "(all kinds)" if kind == "*" else kind, by_key[key], note, bcast)
        rows.append(row)
        if fit is not None:
            fits[key] = fit
            if len(key) == 3:
                fits.setdefault((link, kind), fit)  # sizes run largest first
    for _, group in sorted(axes_of.items()):
        if len({s.axis.label for s in group}) < 2:
            continue
        for s in group:
            top = max(x.nbytes for x in s.samples)
            rows.append(_fit_row(f"  {s.axis.label}", s.kind, s.samples, f"<= {_size(top)} ({s.stopped})", bcast)[1])
    return fits, rows


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def build_profile(base: HardwareProfile, cal: Calibration, fits: dict[FitKey, Fit]) -> HardwareProfile:
    """The calibrated profile: `base` with the measured numbers in place of its own.

    Measured matmul rates become the achievable rate (peak_flops = measured, efficiency = 1); dtypes not
    measured keep the base's achievable rate (peak x efficiency). Each link that was measured gets its
    all-collectives fit as its default alpha/beta, one override per fitted collective (its largest group
    size's, for sizes not timed) and one group override per (collective, group size) timed; a link that was
    not measured (the inter-node link on one node) keeps the base's numbers, as does anything not fitted.
    The profile prices broadcasts with the algorithm of the backend that was measured, the one the fits
    used.
    """
    peaks = {d: v * base.efficiency for d, v in base.peak_flops.items()}
    peaks.update({d: v for d, v in cal.matmul_flops.items() if d in PEAK_DTYPES})
    link_ab = {"intra": (base.intra_alpha, base.intra_beta), "inter": (base.inter_alpha, base.inter_beta)}
    overrides = dict(base.overrides)
    group_overrides = dict(base.group_overrides)
    for key, fit in fits.items():
        if len(key) == 3:
            group_overrides[key] = (fit.alpha, fit.beta)
        elif key[1] == "*":
            link_ab[key[0]] = (fit.alpha, fit.beta)
        else:
            overrides[key] = (fit.alpha, fit.beta)
    measured_links = sorted({key[0] for key in fits})
    if cal.device == "cuda":
        gpus_per_node, memory = cal.device_count or cal.ranks_per_node, cal.device_memory or base.memory_bytes
    else:
        gpus_per_node, memory = max(base.gpus_per_node, cal.ranks_per_node), base.memory_bytes
    kept = [link for link in LINKS if link not in measured_links]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    source = (f"measured by planner calibrate on {socket.gethostname()} at {stamp}: {cal.world_size} ranks "
              f"({cal.ranks_per_node} per node), {cal.backend} on {cal.device_name}, torch {torch.__version__}; "
              f"matmul {cal.matmul_size}^3 and copy bandwidth per rank with every rank busy; collectives "
              f"fitted per link, kind and group size on the cost model's alpha-beta terms"
              + (f"; {' and '.join(kept)} link not measured (kept from the base)" if kept else "")
              + f". Base profile {base.name}: {base.source}")
    return replace(base, name=f"{base.name}-calibrated", source=source, device=cal.device,
                   gpus_per_node=gpus_per_node, memory_bytes=memory, peak_flops=peaks, efficiency=1.0,
                   mem_bandwidth=cal.copy_bandwidth, intra_alpha=link_ab["intra"][0], intra_beta=link_ab["intra"][1],
                   inter_alpha=link_ab["inter"][0], inter_beta=link_ab["inter"][1], overrides=overrides,
                   group_overrides=group_overrides, broadcast_algorithm=broadcast_algorithm(cal.backend))


def write_samples(cal: Calibration, path: str) -> None:
    """Every measured point as CSV (mesh, axes, link, n, kind, bytes, seconds), for plots and audits."""
    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(["mesh", "axes", "link", "n", "kind", "bytes", "seconds"])
    for s in cal.series:
        for x in s.samples:
            w.writerow([str(s.axis.mesh), "".join(s.axis.axes), s.axis.link, x.n, x.kind, x.nbytes,
                        repr(x.seconds)])
    write_atomic(path, f.getvalue(), "the calibration samples")


def _summary(cal: Calibration, profile: HardwareProfile, out: str) -> str:
    flops = ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in cal.matmul_flops.items())
    return (f"{cal.world_size} ranks ({cal.ranks_per_node} per node, {cal.backend} on {cal.device_name}); "
            f"matmul {cal.matmul_size}^3 per rank: {flops}; copy bandwidth per rank "
            f"{cal.copy_bandwidth / 1e9:.2f} GB/s; {cal.passes} passes over the collective sizes; "
            f"measured in {cal.seconds:.1f} s\n"
            f"wrote profile {profile.name!r} to {out}")


def run(config: CalibrateConfig, out: str, *, samples_out: str | None = None,
        echo: TextIO | None = None) -> HardwareProfile:
    """Calibrate on every rank; rank 0 writes `out` (atomically) and prints the fit table and a summary.

    Initialises the process group from torchrun's environment when none exists (and destroys it after).
    `echo`: where rank 0 prints (default stdout). Returns the profile on every rank.
    """
    created = _init_process_group(config.timeout_s)
    try:
        from planner.apply.agree import agree, text_digest

        # Ranks with other settings would time other collectives: agree before the first one.
        agree({"settings": f"{text_digest(repr(config))} (sizes {config.min_bytes}-{config.max_bytes} B, kinds "
                           f"{','.join(config.kinds)})", "world size": str(dist.get_world_size())},
              "the first collective of planner calibrate",
              timeout_s=config.timeout_s)
        device = _device()
        base = load_profile(config.base or _default_base(device))
        cal = calibrate(config)
        fits, rows = fit_calibration(cal)
        profile = build_profile(base, cal, fits)
        if dist.get_rank() == 0:
            profile.save(out, atomic=True)
            if samples_out:
                write_samples(cal, samples_out)
            stream = echo if echo is not None else sys.stdout
            if rows:
                print(format_fit_table(rows), file=stream)
            else:
                print("no communicator group of more than one rank: no collective timed", file=stream)
            for label, kind, fit, _ in rows:
                if not label.startswith(" ") and fit is not None and kind != "(all kinds)" and fit.r2 < R2_WARNING:
                    print(f"warning: {label} {kind}: R^2 {fit.r2:.3f} < {R2_WARNING}; the measurements are noisy "
                          "or the collective does not follow the alpha-beta model on this link", file=stream)
            print(_summary(cal, profile, out), file=stream)
        dist.barrier()
        return profile
    finally:
        if created:
            dist.destroy_process_group()
