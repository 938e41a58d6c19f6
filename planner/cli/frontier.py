"""`planner frontier MODEL --world-size 64`: predicted step time against the memory budget.

The sweep runs from the smallest budget any plan fits (`InfeasibleError.min_budget_bytes` of a plan asked
to fit in 1 byte) to the peak memory of the fastest plan (asked with an unlimited budget), where the plan
stops changing, in geometric steps. The same sweep is made for the uniform-scheme baselines (each scheme
alone, with checkpointing allowed and without it), each also planned at the smallest budget it fits; the
planner is planned at those budgets too, so that it is compared wherever a baseline's line steps down.
Results go to PREFIX.csv and PREFIX.png.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cost_models.errors import PlannerError
from cost_models.files import check_output_path, write_atomic
from cost_models.schemes import BASELINE_SCHEMES
from planner.cli.plan import PLANNING_ARGS, load_example, planning_options
from planner.cli.registry import CliError, arg, command, out_console, progress
from planner.cli.report import scheme_counts
from planner.plans.format import Plan
from planner.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["BASELINE_SCHEMES", "Curve", "Span", "budget_sweep", "probe_span", "trace_curve", "write_csv",
           "frontier_figure", "plot_frontier", "frontier"]

UNLIMITED_BYTES = 2**60  # a budget no model reaches: the plan it gives is the fastest one

PlanAt = Callable[[int], Plan]


@dataclass
class Curve:
    """One series of the plot: the plan (None where nothing fits) at each budget, budgets ascending."""

    label: str
    points: list[tuple[int, Plan | None]]
    note: str = ""

    @property
    def feasible(self) -> list[tuple[int, Plan]]:
        return [(b, p) for b, p in self.points if p is not None]


def budget_sweep(low: int, high: int, n: int) -> list[int]:
    """`n` budgets from `low` to `high` inclusive, evenly spaced on a log scale, rounded up to whole bytes."""
    if n < 2 or high <= low:
        return sorted({low, max(low, high)})
    ratio = (high / low) ** (1 / (n - 1))
    inner = [math.ceil(low * ratio**k) for k in range(1, n - 1)]
    return sorted({low, *inner, high})


@dataclass
class Span:
    """The budget range of one configuration: the smallest budget it fits (and the plan there, when a
    1-byte budget already fits) and its fastest plan, whose peak is where its plan stops changing."""

    low: int
    low_plan: Plan | None
    fastest: Plan

    @property
    def high(self) -> int:
        return self.fastest.predicted.bound_bytes


def probe_span(plan_at: PlanAt, infeasible: type[Exception]) -> Span:
    """Plan with an unlimited budget and with 1 byte; raises `infeasible` if nothing fits at all."""
    fastest = plan_at(UNLIMITED_BYTES)
    try:
        return Span(1, plan_at(1), fastest)
    except infeasible as e:
        need = getattr(e, "min_budget_bytes", None)
        return Span(need if need is not None else fastest.predicted.bound_bytes, None, fastest)


def trace_curve(label: str, plan_at: PlanAt, infeasible: type[Exception], budgets: list[int],
                span: Span | None = None) -> Curve:
    """Plans of one configuration at `budgets` and at the ends of its span (probed unless given): None below
    the span, the fastest plan (without solving again) at or above its top."""
    if span is None:
        try:
            span = probe_span(plan_at, infeasible)
        except infeasible:
            return Curve(label, [], note="infeasible at any budget")
        except PlannerError as e:  # e.g. a scheme this world size cannot use
            return Curve(label, [], note=str(e).splitlines()[0])
    points: dict[int, Plan | None] = {span.high: span.fastest}
    if span.low_plan is not None:
        points[span.low] = span.low_plan
    for b in sorted({span.low, *budgets}):
        if b >= span.high:
            points[b] = span.fastest
        elif b < span.low:
            points[b] = None
        elif b not in points:
            try:
                points[b] = plan_at(b)
            except infeasible:
                points[b] = None
    return Curve(label, sorted(points.items(), key=lambda kv: kv[0]))


def _schemes_cell(plan: Plan) -> str:
    return ";".join(f"{s}:{n}" for s, n in scheme_counts(plan))


def write_csv(path: str, curves: list[Curve]) -> None:
    """One row per (series, budget): budget_bytes, step_time_s, peak_memory_bytes, schemes, checkpointed;
    a series with no point at all gets one row whose note says why. Built in memory, written atomically."""
    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(["series", "budget_bytes", "feasible", "step_time_s", "peak_memory_bytes", "schemes",
                "checkpointed_blocks", "note"])
    for c in curves:
        if not c.points:
            w.writerow([c.label, "", False, "", "", "", "", c.note])
        for budget, p in c.points:
            if p is None:
                w.writerow([c.label, budget, False, "", "", "", "", "nothing fits this budget"])
            else:
                w.writerow([c.label, budget, True, repr(p.predicted.step_time_s), p.predicted.peak_memory_bytes,
                            _schemes_cell(p), len(p.checkpoint), ""])
    write_atomic(path, f.getvalue(), "the frontier CSV")


def _time_unit(largest_s: float) -> tuple[str, float]:
    """The unit (name, seconds) that shows `largest_s` seconds as a number of at least 1 where possible."""
    for name, size in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if largest_s >= size:
            return name, size
    return "ns", 1e-9


def frontier_figure(title: str, planner_curve: Curve, baselines: list[Curve]) -> Figure:
    """Step time against budget (log scale): the planner bold black, each baseline in its scheme's colour
    (`planner.cli.plots.SCHEME_COLORS`), solid with checkpointing allowed and dashed without. Markers are the
    planned budgets; every line runs on to the right edge, since above its last budget the plan no longer
    changes. Between two markers a line is the plan at the lower budget: an upper bound on the best time."""
    from matplotlib.figure import Figure  # Agg canvas: no pyplot state, no display needed
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from planner.cli.plots import SCHEME_COLORS, byte_unit

    colors = {**SCHEME_COLORS, "1d": SCHEME_COLORS["1d_col"]}
    curves = [c for c in [*baselines, planner_curve] if c.feasible]
    right = max((c.feasible[-1][0] for c in curves), default=1) * 1.05
    left = min((c.feasible[0][0] for c in curves), default=1)
    unit, scale = byte_unit(right)
    t_unit, t_scale = _time_unit(max((p.predicted.step_time_s for c in curves for _, p in c.feasible), default=1.0))
    fig = Figure(figsize=(9, 5.5), layout="constrained")
    ax = fig.add_subplot()
    for c in curves:
        xs = [b / scale for b, _ in c.feasible] + [right / scale]
        ys = [p.predicted.step_time_s / t_scale for _, p in c.feasible]
        ys.append(ys[-1])
        if c is planner_curve:
            ax.plot(xs[:-1], ys[:-1], linestyle="none", color="black", marker="s", markersize=5, zorder=6)
            ax.plot(xs, ys, drawstyle="steps-post", color="black", linewidth=2.6, label=c.label, zorder=5)
            continue
        no_ckpt = "no ckpt" in c.label
        color = colors.get(c.label.split()[0], "tab:olive")
        ax.plot(xs[:-1], ys[:-1], linestyle="none", color=color, marker="o" if no_ckpt else "^", markersize=3.5)
        ax.plot(xs, ys, drawstyle="steps-post", color=color, linestyle="--" if no_ckpt else "-",
                marker="o" if no_ckpt else "^", markevery=[0], markersize=3.5, linewidth=1.2, alpha=0.85,
                label=c.label)
    ax.set_xscale("log")
    decades = math.log10(right / left) if curves else 1
    subs = (1.0,) if decades > 2.5 else (1.0, 2.0, 5.0) if decades > 1 else (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(left / scale / 1.05, right / scale)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"memory budget per GPU ({unit}, log scale)")
    ax.set_ylabel(f"predicted step time ({t_unit})")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", title="scheme (checkpointing)")
    return fig


def plot_frontier(path: str, title: str, planner_curve: Curve, baselines: list[Curve]) -> None:
    """Write `frontier_figure` to `path` (PNG at 120 dpi)."""
    buffer = io.BytesIO()
    frontier_figure(title, planner_curve, baselines).savefig(buffer, format="png", dpi=120)
    write_atomic(path, buffer.getvalue(), "the frontier plot")


def _baseline_names(text: str) -> list[str]:
    if text.strip().lower() == "none":
        return []
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in BASELINE_SCHEMES]
    if unknown:
        raise CliError(f"--baselines: unknown scheme {unknown[0]!r}; use a comma-separated subset of "
                       f"{','.join(BASELINE_SCHEMES)}, or none")
    return names


@command(
    "frontier", "sweep the memory budget: predicted step time per budget, as CSV and a PNG plot",
    args=[*PLANNING_ARGS,
          arg("--budgets", type=int, default=10, metavar="N", help="number of budgets in the sweep (default 10)"),
          arg("--out-prefix", default="frontier", metavar="PREFIX", help="writes PREFIX.csv and PREFIX.png"),
          arg("--baselines", default=",".join(BASELINE_SCHEMES), metavar="LIST",
              help="uniform-scheme reference lines to add, each with and without checkpointing "
                   "(default: all; 'none' for none)")],
    description="Plan MODEL at budgets from the smallest that fits to where the plan stops changing, and the "
                "same for each uniform scheme; write the points to PREFIX.csv and plot step time against "
                "budget to PREFIX.png.",
)
def frontier(args: argparse.Namespace) -> int:
    if args.budgets < 2:
        raise CliError(f"--budgets must be at least 2, got {args.budgets}")
    options = planning_options(args)
    baselines = _baseline_names(args.baselines)
    for suffix in ("csv", "png"):  # refused before the sweep, not after it
        check_output_path(f"{args.out_prefix}.{suffix}", f"the frontier {suffix.upper()}")
    example = load_example(args.model)
    from planner.api import InfeasibleError, plan
    from planner.trace.tracer import capture

    console = out_console()
    with progress(f"capturing {example.name}"):
        graph = capture(example.model, example.example_inputs, name=example.name)

    def plan_with(**extra: Any) -> PlanAt:
        return lambda budget: plan(graph, budget, **{**options, **extra})

    main = plan_with()
    with progress(f"finding the budget range of {example.name}"):
        span = probe_span(main, InfeasibleError)
    budgets = budget_sweep(span.low, span.high, args.budgets)
    console.print(f"{example.name}: plans fit from {format_bytes(span.low)} per GPU; the fastest plan needs "
                  f"{format_bytes(span.high)}; sweeping {len(budgets)} budgets")
    curves = []
    for scheme in baselines:
        for ckpt in (True, False):
            label = f"{scheme} ({'ckpt' if ckpt else 'no ckpt'})"
            with progress(f"baseline {label}"):
                curves.append(trace_curve(label, plan_with(schemes=[scheme], checkpointing=ckpt), InfeasibleError,
                                          budgets))
    # The planner is also planned where a baseline starts to fit, so the two are compared at the budgets
    # where a baseline's line steps down, not only at the sweep's.
    starts = {c.feasible[0][0] for c in curves if c.feasible} - set(budgets)
    budgets = sorted({*budgets, *(b for b in starts if span.low < b < span.high)})
    with progress(f"planning {example.name} at {len(budgets)} budgets"):
        planner_curve = trace_curve("planner", main, InfeasibleError, budgets, span)
    for c in [planner_curve, *curves]:
        best = min((p.predicted.step_time_s for _, p in c.feasible), default=None)
        detail = f"best {format_seconds(best)}, fits from {format_bytes(c.feasible[0][0])}" if best is not None \
            else c.note or "no feasible point"
        console.print(f"  {c.label:<26} {detail}")
    csv_path, png_path = f"{args.out_prefix}.csv", f"{args.out_prefix}.png"
    try:
        write_csv(csv_path, [planner_curve, *curves])
        top = span.fastest
        plot_frontier(png_path, f"{example.name} on {top.world_size} GPUs, {top.hardware.get('name', '?')}",
                      planner_curve, curves)
    except OSError as e:
        raise CliError(f"cannot write {args.out_prefix}.csv/.png: {e.strerror or e}") from e
    console.print(f"wrote {csv_path} and {png_path}")
    return 0

