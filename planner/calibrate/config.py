"""What `planner calibrate` measures and how long it may take (`CalibrateConfig`), checked when it is made.

The command line that fills it in is `planner.cli.calibrate`; the run that uses it is `planner.calibrate.run`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.errors import PlannerError
from cost_models.mesh import Mesh
from cost_models.redistribution import COLLECTIVE_KINDS

__all__ = ["CalibrateError", "CalibrateConfig"]


class CalibrateError(PlannerError, ValueError):
    """A calibration setting that cannot work (names the option and a value that would)."""


@dataclass(frozen=True)
class CalibrateConfig:
    """What `planner calibrate` measures and how long it may take.

    base: profile the result starts from (built-in name or JSON path); None picks by device (cpu-gloo on
        CPU, h100-80gb on H100/H200, a100-80gb on other GPUs).
    min_bytes, max_bytes: smallest and largest message (bytes convention of docs/ARCHITECTURE.md).
    growth: factor between consecutive message sizes (an integer >= 2); 8 spends little on the latency-bound
        small sizes (they all cost about the same) and reaches the bandwidth-bound ones within the budget.
    time_budget_s: seconds for all collective timings together; a series stops growing when its next size
        would not fit its share (each series still gets 3 sizes, so a tiny budget can be exceeded).
    retry_budget_s: further seconds for re-timing the series whose fit has R^2 below 0.9 (a burst of
        background load spoiled some of its sizes); 0 turns retries off.
    warmup: untimed calls before each point's batches (per pass).
    reps: timed batches per message size over all passes (the slowest rank's median is kept).
    passes: times each point is revisited at a different moment of the run (robust to bursts of load).
    timeout_s: limit of every collective, so a dead rank fails the run instead of hanging it.
    every_group: time every distinct group over mesh axes, not one per (link, group size) (the profile
        pools groups of the same link and size, so this only adds samples).
    compute_seconds: at least this long per matmul dtype and for the copy (every rank at once).
    kinds: collectives to time. meshes: meshes whose axes are timed (default: candidate_meshes).
    """

    base: str | None = None
    min_bytes: int = 4 * 2**10
    max_bytes: int = 256 * 2**20
    growth: int = 8
    time_budget_s: float = 50.0
    retry_budget_s: float = 25.0
    warmup: int = 2
    reps: int = 9
    passes: int = 3
    every_group: bool = False
    compute_seconds: float = 0.5
    timeout_s: float = 120.0
    kinds: tuple[str, ...] = COLLECTIVE_KINDS
    meshes: tuple[Mesh, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("min_bytes", "max_bytes", "growth", "warmup", "reps", "passes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise CalibrateError(f"{name} must be an integer, got {value!r}")
        if self.min_bytes < 4:
            raise CalibrateError(f"--min-bytes must be at least 4 bytes (one float32), got {self.min_bytes}")
        if self.max_bytes < self.min_bytes:
            raise CalibrateError(f"--max-bytes ({self.max_bytes} bytes) is smaller than --min-bytes "
                                 f"({self.min_bytes} bytes); pass e.g. --max-bytes 256MiB")
        if self.growth < 2:
            raise CalibrateError(f"--growth must be an integer >= 2 (the factor between message sizes), "
                                 f"got {self.growth}")
        if not self.time_budget_s > 0:
            raise CalibrateError(f"--time-budget must be a positive number of seconds, got {self.time_budget_s}")
        if not self.retry_budget_s >= 0:
            raise CalibrateError(f"--retry-budget must be a number of seconds >= 0 (0: no retries), "
                                 f"got {self.retry_budget_s}")
        if self.warmup < 0 or self.reps < 1 or not 1 <= self.passes <= self.reps:
            raise CalibrateError(f"need --warmup >= 0, --reps >= 1 and 1 <= --passes <= --reps, got "
                                 f"{self.warmup}, {self.reps} and {self.passes}")
        if not self.compute_seconds > 0:
            raise CalibrateError(f"--compute-seconds must be positive, got {self.compute_seconds}")
        if not self.timeout_s > 0:
            raise CalibrateError(f"--timeout must be a positive number of seconds, got {self.timeout_s}")
        unknown = [k for k in self.kinds if k not in COLLECTIVE_KINDS]
        if unknown or not self.kinds:
            raise CalibrateError(f"--kinds: unknown or no collectives {unknown}; choose from "
                                 f"{', '.join(COLLECTIVE_KINDS)}")
        if self.meshes is not None and not self.meshes:
            raise CalibrateError("meshes is empty; pass None to time the meshes the planner tries")
