"""Fitting alpha-beta numbers to measured collective timings, for `planner calibrate`.

The planner prices a collective of kind k over n ranks and B bytes (ARCHITECTURE's bytes convention) as

    time = a(k, n, B) * alpha + b(k, n, B) * beta

with the ring formulas of `cost_models.comm`: all-gather, reduce-scatter and all-to-all a = n - 1,
b = B (n - 1) / n; all-reduce twice that; broadcast a = ceil(log2 n) and b = B when pipelined (NCCL) or
b = B ceil(log2 n) along gloo's binomial tree. Calibration measures times over many (n, B) and solves for
(alpha, beta) by least squares on exactly these terms, so the fitted numbers plug straight into the cost
model. Pure functions of plain data: no process group, no tensors.

The broadcast formula must be the backend's: gloo's broadcast time grows with ceil(log2 n) full copies
of the buffer, and fitted with b = B over group sizes 2, 4 and 8 together (8 gloo ranks on 2 cores) it
left R^2 0.81 and a 110% worst residual, the per-size bandwidths falling as 1 : 1.6 : 2.8 (log2 n is
1 : 2 : 3); with b = B ceil(log2 n) the same samples fit with R^2 0.99.

Each sample is weighted by 1 / sqrt(measured time), i.e. the fit minimises sum((pred - t)^2 / t). Plain
least squares on seconds lets the largest messages decide everything and often returns a negative alpha;
relative residuals (weight 1 / t) let the many latency-bound small messages outvote the few large ones
that carry the bandwidth. The planner needs both terms, since small messages are exactly where schemes
differ; on measurements taken here (8 gloo ranks, 2 cores) 1 / sqrt(t) kept alpha within a few percent of
the relative fit and raised R^2 on seconds from 0.87-0.98 to 0.94-0.98. alpha >= 0 and beta > 0 are
enforced (the best fit on the boundary when the free fit leaves it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cost_models.comm import CommError, ring_seconds
from cost_models.errors import PlannerError
from cost_models.redistribution import COLLECTIVE_KINDS

__all__ = ["MIN_BETA", "Sample", "Fit", "FitError", "model_terms", "predict_seconds", "fit_alpha_beta", "format_fit_table"]

# Smallest beta accepted (s/byte): 1e-15 is 1 PB/s, far beyond any link; a fit below it means the
# measurements did not grow with the message size and carry no bandwidth information.
MIN_BETA = 1e-15


class FitError(PlannerError, ValueError):
    """Samples that cannot determine alpha and beta (too few, one message size only, bad numbers)."""


@dataclass(frozen=True)
class Sample:
    """One measured point: a collective of `kind` over `n` ranks moving `nbytes` (bytes convention) took
    `seconds` (median over repetitions of the slowest rank)."""

    kind: str
    n: int
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class Fit:
    """Fitted alpha (seconds per latency term) and beta (seconds per byte) with the fit quality.

    r2: coefficient of determination on seconds, 1 - SS_res / SS_tot (1.0 when every sample took the same
        time and the fit reproduces it). beta == MIN_BETA means the times did not grow with the size. worst_rel_residual: max |predicted - measured| / measured.
    """

    alpha: float
    beta: float
    r2: float
    worst_rel_residual: float
    samples: int

    @property
    def bandwidth(self) -> float:
        """Achieved bus bandwidth in bytes/s (1 / beta)."""
        return 1.0 / self.beta


def model_terms(kind: str, n: int, nbytes: float, broadcast: str = "pipelined") -> tuple[float, float]:
    """The (alpha, beta) coefficients of the cost model's formula for one collective (`broadcast`: the
    broadcast algorithm, "pipelined" or "binomial"): evaluated through `cost_models.comm.ring_seconds`
    itself, so a fit on them is a fit of exactly what the planner prices."""
    if kind not in COLLECTIVE_KINDS:
        raise FitError(f"unknown collective kind {kind!r}; expected one of {', '.join(COLLECTIVE_KINDS)}")
    try:
        return (ring_seconds(kind, n, nbytes, 1.0, 0.0, broadcast),
                ring_seconds(kind, n, nbytes, 0.0, 1.0, broadcast))
    except CommError as e:
        raise FitError(str(e)) from None


def predict_seconds(kind: str, n: int, nbytes: float, alpha: float, beta: float,
                    broadcast: str = "pipelined") -> float:
    """Modelled time of one collective with the given alpha and beta."""
    a, b = model_terms(kind, n, nbytes, broadcast)
    return a * alpha + b * beta


def _weighted_lstsq(terms: np.ndarray, t: np.ndarray, free: Sequence[int]) -> np.ndarray:
    """Least squares of (terms @ coef - t) / sqrt(t) over the columns in `free`; the others stay 0."""
    w = 1.0 / np.sqrt(t)
    coef = np.zeros(2)
    a = terms[:, list(free)] * w[:, None]
    sol, *_ = np.linalg.lstsq(a, t * w, rcond=None)
    coef[list(free)] = sol
    return coef


def fit_alpha_beta(samples: Sequence[Sample], broadcast: str = "pipelined") -> Fit:
    """Fit one (alpha, beta) to all `samples` (any mix of kinds and group sizes) on the cost-model terms,
    broadcasts on those of the `broadcast` algorithm (the backend's: "binomial" for gloo).

    Needs at least 3 samples with at least 2 distinct beta terms (message sizes); raises FitError otherwise.
    """
    if len(samples) < 3:
        raise FitError(f"need at least 3 timed message sizes to fit alpha and beta, got {len(samples)}; "
                       "raise --max-bytes or --time-budget")
    terms = np.array([model_terms(s.kind, s.n, s.nbytes, broadcast) for s in samples], dtype=float)
    t = np.array([s.seconds for s in samples], dtype=float)
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise FitError("measured times must be positive and finite")
    if np.any(terms[:, 0] <= 0):
        raise FitError("samples with a group of one rank carry no communication; drop them before fitting")
    if len(set(terms[:, 1] / terms[:, 0])) < 2:
        raise FitError("all samples have the same message size per latency term, so alpha and beta cannot be "
                       "told apart; time at least two message sizes")
    candidates = []
    for free in ((0, 1), (1,), (0,)):
        coef = _weighted_lstsq(terms, t, free)
        if coef[0] >= 0 and coef[1] >= 0:
            res = (terms @ coef - t) / np.sqrt(t)
            candidates.append((float(res @ res), coef))
    # (0,) alone always gives alpha > 0 (times are positive), so there is at least one candidate.
    _, coef = min(candidates, key=lambda c: c[0])
    pred = terms @ coef  # quality of the fit itself; the floor on beta below changes no prediction visibly
    alpha, beta = float(coef[0]), max(float(coef[1]), MIN_BETA)
    ss_res = float(np.sum((t - pred) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    worst = float(np.max(np.abs(pred - t) / t))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if worst < 1e-9 else 0.0)
    return Fit(alpha, beta, r2, worst, len(samples))


def format_fit_table(rows: Sequence[tuple[str, str, Fit | None, str]]) -> str:
    """A plain-text table of fits: one row per (group label, kind, fit or None, note)."""
    header = f"{'group':<22} {'collective':<15} {'alpha (us)':>10} {'GB/s':>9} {'R^2':>7} {'worst res':>9} {'pts':>4}"
    lines = [header, "-" * len(header)]
    for label, kind, fit, note in rows:
        if fit is None:
            lines.append(f"{label:<22} {kind:<15} {'-':>10} {'-':>9} {'-':>7} {'-':>9} {'-':>4}  {note}")
            continue
        lines.append(f"{label:<22} {kind:<15} {fit.alpha * 1e6:>10.1f} {fit.bandwidth / 1e9:>9.3f} "
                     f"{fit.r2:>7.3f} {fit.worst_rel_residual:>8.0%} {fit.samples:>4}" + (f"  {note}" if note else ""))
    return "\n".join(lines)
