"""The numbers `planner verify` compares, and the report it prints.

Errors are relative: max |parallel - dense| / max |dense| per tensor (so a tensor of zeros compares by its
absolute error). Communication is compared per collective kind and phase (forward, backward, recompute),
measured bytes against predicted bytes; activations per rank, measured against predicted bytes; the peak
memory of a training step per rank (`planner.verify.measure_memory`) against the plan's `peak_memory_bytes`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

__all__ = ["rel_error", "ErrorRow", "VerifyReport", "format_report", "COMM_PHASES"]

COMM_PHASES = ("forward", "backward", "recompute")


def rel_error(got: torch.Tensor, want: torch.Tensor, floor: float = 0.0) -> float:
    """max |got - want| / max(max |want|, floor) (the absolute error when both are 0); inf on a shape
    mismatch. `floor` is the scale below which a tensor counts as small: parameters compared after
    optimizer steps use the largest value in the whole state dict, because a zero-initialised bias holds
    values near the update size, where AdamW's per-element normalisation turns rounding noise into
    relative differences that say nothing about the parallelisation."""
    if got.shape != want.shape:
        return float("inf")
    a, b = got.detach().double().cpu(), want.detach().double().cpu()
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    scale = max(b.abs().max().item() if b.numel() else 0.0, floor)
    return diff / scale if scale > 0 else diff


@dataclass
class ErrorRow:
    """One compared quantity: its name, the largest relative error and which tensor had it, how many
    tensors were compared, and every tensor above the tolerance (name, error; worst first)."""

    what: str
    error: float
    worst: str = ""
    count: int = 1
    failing: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class VerifyReport:
    """Everything `verify` found on rank 0 (activations gathered from every rank)."""

    model: str
    plan: str
    world_size: int
    mesh: str
    tol: float
    act_tol: float
    errors: list[ErrorRow] = field(default_factory=list)
    step_losses: list[tuple[float, float]] = field(default_factory=list)
    measured_comm: Counter = field(default_factory=Counter)
    predicted_comm: Counter = field(default_factory=Counter)
    unplanned_comm: Counter = field(default_factory=Counter)   # (kind, tag) -> bytes the plan does not price
    plan_comm_total: int = 0
    measured_act: list[int] = field(default_factory=list)
    predicted_act: int = 0
    comm_off_ranks: list[int] = field(default_factory=list)  # ranks whose collectives differ from the prediction
    step_peak: list[int] = field(default_factory=list)  # CUDA only: allocator peak above the memory held before
    predicted_step_peak: int = 0
    measured_peak: list[int] = field(default_factory=list)  # per rank: planner.verify.measure_memory.step_peak_bytes
    peak_at: list[str] = field(default_factory=list)  # per rank: where that peak was reached ("" when unknown)
    predicted_peak: int = 0
    peak_tol: float = 0.10
    dropout: tuple[int, list[str]] | None = None  # (dropout ops with p > 0, mask-rule violations)

    # --- verdicts --------------------------------------------------------------------------------
    def numeric_ok(self) -> bool:
        if self.dropout is not None and self.dropout[1]:
            return False
        return all(r.error <= self.tol for r in self.errors) and all(
            abs(p - d) <= self.tol * max(abs(d), 1e-30) for d, p in self.step_losses)

    def comm_ok(self) -> bool:
        return self.measured_comm == self.predicted_comm and not self.comm_off_ranks

    def act_errors(self) -> list[float]:
        p = max(self.predicted_act, 1)
        return [(m - self.predicted_act) / p for m in self.measured_act]

    def act_ok(self) -> bool:
        return all(abs(e) <= self.act_tol for e in self.act_errors())

    def peak_errors(self) -> list[float]:
        p = max(self.predicted_peak, 1)
        return [(m - self.predicted_peak) / p for m in self.measured_peak]

    def peak_ok(self) -> bool:
        """Fails only when a rank needs more than the prediction + tolerance (a plan that fits its budget
        on paper could run out of memory). Over-prediction is reported, not failed: the model counts every
        gradient and every saved activation as alive together, which overshoots when the model states
        dominate (gpt-tiny at its default batch: about 13%), and is the safe direction for a budget."""
        return all(e <= self.peak_tol for e in self.peak_errors())

    @property
    def ok(self) -> bool:
        return self.numeric_ok() and self.comm_ok() and self.act_ok() and self.peak_ok()


def _mark(ok: bool) -> str:
    return "ok" if ok else "FAIL"


def _fmt_bytes(n: int) -> str:
    return f"{n:,}"


def _table(rows: Iterable[tuple[str, ...]], header: tuple[str, ...]) -> list[str]:
    rows = [header] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    out = []
    for k, r in enumerate(rows):
        out.append("  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if k == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return out


FAILING_LIMIT = 20
"""At most this many failing tensors are listed per quantity (the count says how many there are)."""


def _failing_lines(r: VerifyReport) -> list[str]:
    lines = []
    for e in r.errors:
        if not e.failing:
            continue
        lines.append(f"  {e.what}: {len(e.failing)} of {e.count} tensor(s) above the tolerance"
                     + (f" (the worst {FAILING_LIMIT} listed)" if len(e.failing) > FAILING_LIMIT else "") + ":")
        lines += [f"    FAIL {err:.3e}  {name}" for name, err in e.failing[:FAILING_LIMIT]]
    return lines


def format_report(r: VerifyReport) -> str:
    """The human-readable report (rank 0 prints it)."""
    lines = [f"planner verify: {r.model} with {r.plan} on {r.world_size} ranks, mesh {r.mesh}", ""]
    lines.append(f"Parallel vs dense (relative error, tolerance {r.tol:g}):")
    rows = [(e.what, f"{e.error:.3e}", _mark(e.error <= r.tol), e.worst) for e in r.errors]
    for i, (d, p) in enumerate(r.step_losses):
        err = abs(p - d) / max(abs(d), 1e-30)
        rows.append((f"loss after step {i + 1}", f"{err:.3e}", _mark(err <= r.tol), f"dense {d:.6f} parallel {p:.6f}"))
    lines += _table(rows, ("quantity", "rel. error", "", "worst / values"))
    lines += _failing_lines(r)
    if r.dropout is not None:
        n, problems = r.dropout
        lines.append(f"  dropout: {n} op(s) with p > 0; the numbers above compare dense and parallel with dropout "
                     "off in both")
        lines.append("  dropout masks (same where ranks hold the same elements, independent elsewhere, kept 1 - p): "
                     + ("ok" if not problems else "FAIL"))
        lines += [f"    FAIL {p}" for p in problems[:FAILING_LIMIT]]
    if any(e.what.startswith("gradients") for e in r.errors):
        lines.append("  (per tensor: max |parallel - dense| / max(its own max |dense|, a floor); the floor of gradients "
                     "is 1e-5 x the global gradient norm, below which a gradient is rounding noise)")
    if any(e.what.startswith("parameters") for e in r.errors):
        lines.append("  (parameters after the steps: per tensor on its own scale, with 100 x the largest distance any "
                     "parameter moved as the floor)")
    lines += ["", "Communication per rank, one step (bytes; rank 0; measured by layers3d.CommCounter):"]
    keys = sorted(set(r.measured_comm) | set(r.predicted_comm))
    rows = [(f"{k} ({ph})", _fmt_bytes(r.measured_comm[(k, ph)]), _fmt_bytes(r.predicted_comm[(k, ph)]),
             _mark(r.measured_comm[(k, ph)] == r.predicted_comm[(k, ph)])) for k, ph in keys]
    tm, tp = sum(r.measured_comm.values()), sum(r.predicted_comm.values())
    rows.append(("total", _fmt_bytes(tm), _fmt_bytes(tp), _mark(tm == tp)))
    lines += _table(rows, ("collective", "measured", "predicted", ""))
    if r.plan_comm_total != tp:
        lines.append(f"  note: the plan's predicted.comm_bytes is {_fmt_bytes(r.plan_comm_total)}, its collectives "
                     f"recomputed per kind sum to {_fmt_bytes(tp)}: the plan file is out of step with the cost model")
    if r.comm_off_ranks:
        lines.append(f"  FAIL: on ranks {r.comm_off_ranks} the collectives differ from the prediction")
    if r.unplanned_comm:
        lines.append("  not in the plan (input/output conversions of the drop-in interface, tied weights):")
        lines += ["    " + f"{k} [{tag}]: {_fmt_bytes(b)}" for (k, tag), b in sorted(r.unplanned_comm.items())]
    lines += ["", f"Saved activations per rank (bytes; measured with saved_tensors_hooks, unique storages; "
                  f"tolerance {r.act_tol:.0%}):"]
    rows = [(f"rank {i}", _fmt_bytes(m), _fmt_bytes(r.predicted_act), f"{e:+.2%}", _mark(abs(e) <= r.act_tol))
            for i, (m, e) in enumerate(zip(r.measured_act, r.act_errors()))]
    lines += _table(rows, ("rank", "measured", "predicted", "diff", ""))
    if r.step_peak:
        lines += ["", "Peak memory of the first step above what was allocated before it (CUDA allocator; for "
                      "information: the prediction is activations + transient):"]
        lines += _table([(f"rank {i}", _fmt_bytes(p), _fmt_bytes(r.predicted_step_peak))
                         for i, p in enumerate(r.step_peak)], ("rank", "measured", "predicted"))
    if r.measured_peak:
        lines += ["", f"Peak memory of a training step per rank (bytes; live tensor storages: parameters, gradients, "
                      f"optimizer states and everything the step creates; tolerance {r.peak_tol:.0%}, FAIL above it, "
                      f"'over' when over-predicted beyond it):"]
        rows = [(f"rank {i}", _fmt_bytes(m), _fmt_bytes(r.predicted_peak), f"{m / max(r.predicted_peak, 1):.3f}",
                 f"{e:+.2%}", "over" if e < -r.peak_tol else _mark(e <= r.peak_tol))
                for i, (m, e) in enumerate(zip(r.measured_peak, r.peak_errors()))]
        lines += _table(rows, ("rank", "measured", "predicted", "ratio", "diff", ""))
        failed: dict[str, list[int]] = {}  # where the step reached the peak the prediction misses -> ranks
        for i, (at, e) in enumerate(zip(r.peak_at, r.peak_errors())):
            if at and e > r.peak_tol:
                failed.setdefault(at, []).append(i)
        if failed:  # the first place to look
            lines += ["where the failing ranks reached their peak:"]
            lines += [f"  rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {at}"
                      for at, ranks in failed.items()]
    verdict = "PASS" if r.ok else "FAIL: " + ", ".join(
        w for w, ok in (("numerics", r.numeric_ok()), ("communication", r.comm_ok()), ("activations", r.act_ok()),
                        ("peak memory", r.peak_ok())) if not ok)
    lines += ["", verdict]
    return "\n".join(lines)
