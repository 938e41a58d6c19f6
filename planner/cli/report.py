"""Showing a plan to people: the summary `planner plan` prints and the per-op tables of `planner explain`.

The totals of the per-op table are computed from the assignments and redistributions by the accounting
contract of `planner.plans.format` (sums, a max for transient memory, the step's peak by
`cost_models.memory.step_peak`); `check_totals` compares them with
the plan's own `predicted` numbers, so a plan whose parts do not add up is noticed.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from cost_models.memory import step_peak
from cost_models.ops import DTYPE_BYTES
from cost_models.optimizer import optimizer_step_bytes
from planner.plans.format import Assignment, Plan
from planner.search.solve.problem import FORMULAS_ONLY
from planner.units import format_bytes, format_seconds

__all__ = ["Totals", "plan_totals", "check_totals", "scheme_counts", "solver_line", "summary_table", "explain_renderables"]


@dataclass(frozen=True)
class Totals:
    """What the per-op rows of a plan add up to (field names as in `Predicted`)."""

    peak_memory_bytes: int
    model_state_bytes: int
    activation_bytes: int
    transient_bytes: int
    released_bytes: int
    optimizer_bytes: int
    step_time_s: float
    compute_s: float
    comm_s: float
    comm_bytes: int
    recompute_s: float


def plan_totals(plan: Plan) -> Totals:
    """Sum the assignments' costs (max for transient) and the redistributions, per the accounting contract."""
    costs = [a.cost for a in plan.assignments]
    states = sum(c.state_bytes for c in costs)
    saved = sum(c.saved_bytes for c in costs)
    opt = optimizer_step_bytes(plan.options.optimizer, (c.optimizer_bytes for c in costs),
                               [(i.shape, DTYPE_BYTES[i.dtype]) for i in plan.model.inputs], plan.options.inputs,
                               plan.mesh)
    transient = max((c.transient_bytes for c in costs), default=0)
    compute = sum(c.compute_s for c in costs)
    comm = sum(c.comm_s for c in costs) + sum(r.seconds for r in plan.redistributions)
    recompute = sum(c.recompute_s for c in costs)
    sp = step_peak([(c.state_bytes, c.saved_bytes, c.transient_bytes) for c in costs], plan.options.bytes_per_param,
                   optimizer_bytes=opt)
    return Totals(peak_memory_bytes=sp.peak, model_state_bytes=states, activation_bytes=saved,
                  transient_bytes=transient, released_bytes=sp.released, optimizer_bytes=opt, step_time_s=compute + comm + recompute,
                  compute_s=compute, comm_s=comm, comm_bytes=sum(c.comm_bytes for c in costs)
                  + sum(r.comm_bytes for r in plan.redistributions), recompute_s=recompute)


def check_totals(plan: Plan, rel_tol: float = 1e-9) -> list[str]:
    """One line per `predicted` number that the per-op rows do not add up to (empty when all agree)."""
    totals = plan_totals(plan)
    problems = []
    for f in dataclasses.fields(Totals):
        ours, theirs = getattr(totals, f.name), getattr(plan.predicted, f.name)
        agree = ours == theirs if isinstance(ours, int) else math.isclose(ours, theirs, rel_tol=rel_tol,
                                                                           abs_tol=1e-15)
        if not agree:
            show = format_bytes if f.name.endswith("bytes") else format_seconds
            problems.append(f"predicted.{f.name} is {show(theirs)} ({theirs!r}) but the ops add up to "
                            f"{show(ours)} ({ours!r})")
    return problems


def scheme_counts(plan: Plan, include_follow: bool = False) -> list[tuple[str, int]]:
    """(scheme, number of ops) pairs, most used first; ops that follow their input are left out by default."""
    counts = Counter(a.scheme for a in plan.assignments if include_follow or a.scheme != "follow")
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _names(items: list[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def solver_line(plan: Plan) -> str:
    """How the solve went, in words: status, seconds, and unless proven optimal the gap to the proven lower
    bound and why the solver stopped (the plan's solver message); where proven for the solver's formulas only,
    that (`FORMULAS_ONLY`)."""
    s = plan.solver
    if s.gap is None or math.isnan(s.gap):  # None or NaN: the solver stopped without a bound on the optimum
        gap = ", gap unknown" if s.status == "feasible" else ""
    else:
        gap = f", gap {s.gap:.2%}"
        if s.status != "optimal" and s.bound is not None:
            gap += f" to the lower bound {format_seconds(s.bound)}"
    note = f" ({s.message})" if s.message and s.status != "optimal" else ""
    if s.status == "optimal" and FORMULAS_ONLY in s.message:
        note = f" ({FORMULAS_ONLY})"
    return f"{s.name} {s.status} in {format_seconds(s.seconds)}{gap}{', ' + s.method if s.method else ''}{note}"


def summary_table(plan: Plan) -> Table:
    """The short summary `planner plan` prints: mesh, schemes, checkpointing, memory, time, solver."""
    p = plan.predicted
    blocks = list(dict.fromkeys(a.block for a in plan.assignments if a.block is not None))
    table = Table(title=f"plan for {plan.model.name}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    mesh = plan.mesh
    table.add_row("mesh", f"{'x'.join(map(str, mesh.shape))} (axes {', '.join(mesh.axis_names)}), "
                          f"{plan.world_size} ranks, {mesh.ranks_per_node} per node")
    table.add_row("hardware", f"{plan.hardware.get('name', '?')}, {plan.options.device} semantics, "
                              f"{plan.options.bytes_per_param} bytes per parameter"
                              + (f", {plan.options.optimizer} AdamW" if plan.options.optimizer else ""))
    table.add_row("schemes", ", ".join(f"{name} x{n}" for name, n in scheme_counts(plan)) or "-")
    ckpt = f"{len(plan.checkpoint)} of {len(blocks)} blocks" + (f": {_names(plan.checkpoint)}" if plan.checkpoint
                                                                 else "")
    table.add_row("checkpointed", ckpt if blocks else "no repeated blocks")
    # the budget is checked against the sum with everything alive together (Predicted.bound_bytes)
    fits = "fits" if p.bound_bytes <= plan.budget_bytes else "DOES NOT FIT"
    in_step = p.optimizer_bytes > 0 and p.peak_memory_bytes == p.model_state_bytes + p.optimizer_bytes
    step = f", optimizer step {format_bytes(p.optimizer_bytes)} beside the states" if p.optimizer_bytes else ""
    table.add_row("peak memory", f"{format_bytes(p.peak_memory_bytes)} per rank"
                                 f"{' (in the optimizer step)' if in_step else ''}: states "
                                 f"{format_bytes(p.model_state_bytes)} + activations {format_bytes(p.activation_bytes)}"
                                 f" + transient {format_bytes(p.transient_bytes)}{step}; "
                                 f"{format_bytes(p.bound_bytes)} with everything alive together ("
                                 f"{format_bytes(p.released_bytes)} of it not at the peak), {fits} the budget of "
                                 f"{format_bytes(plan.budget_bytes)}")
    table.add_row("step time", f"{format_seconds(p.step_time_s)} = compute {format_seconds(p.compute_s)} + comm "
                               f"{format_seconds(p.comm_s)} + recompute {format_seconds(p.recompute_s)}")
    table.add_row("communication", f"{format_bytes(p.comm_bytes)} per rank per step, "
                                   f"{len(plan.redistributions)} redistributions")
    table.add_row("solver", solver_line(plan))
    return table


def _layouts(a: Assignment) -> str:
    ins = ", ".join(str(x) if x is not None else "_" for x in a.inputs)
    return f"{ins} -> {', '.join(str(x) for x in a.outputs)}"


# Short kind names for the narrow (default) table.
_KIND_SHORT = {"embedding": "embed", "layer_norm": "norm", "cross_entropy": "xent", "activation": "act",
               "elementwise": "elemwise", "contiguous": "contig", "reduction": "reduce"}


_NODE_WIDTH = 20


def _cut_front(name: str, width: int) -> str:
    """`name` in at most `width` characters, its start cut: the end of an op name tells ops apart
    (…h_0_attn_c_attn / …h_1_attn_c_proj), its start is the model's common prefix."""
    return name if len(name) <= width else "…" + name[len(name) - width + 1:]


def _op_table(plan: Plan, show_all: bool, wide: bool = False) -> tuple[Table, int]:
    """The per-op table. Narrow by default (fits 120 columns: the strategy column left out, times summed,
    long names cut at the front with an ellipsis); `wide` shows every column in full."""
    totals = plan_totals(plan)
    shown = [a for a in plan.assignments if show_all or a.scheme != "follow"]
    table = Table(title=f"{plan.model.name} on mesh {plan.mesh}: {len(plan.assignments)} ops", show_footer=True,
                  title_justify="left", box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD, show_edge=wide,
                  padding=(0, 1), collapse_padding=not wide, pad_edge=wide)
    footer = {
        "node": f"total ({len(plan.assignments)} ops)", "states": format_bytes(totals.model_state_bytes),
        "saved": format_bytes(totals.activation_bytes), "transient": f"max {format_bytes(totals.transient_bytes)}",
        "comm": format_bytes(totals.comm_bytes), "compute": format_seconds(totals.compute_s),
        "comm time": format_seconds(totals.comm_s), "recompute": format_seconds(totals.recompute_s),
        "time": format_seconds(totals.compute_s + totals.comm_s + totals.recompute_s),
    }
    if not wide:
        footer["transient"] = format_bytes(totals.transient_bytes)  # the largest, as the note below says
    if wide:
        names = ("node", "kind", "scheme", "strategy", "layouts in -> out", "states", "saved", "transient", "comm",
                 "compute", "comm time", "recompute")
    else:
        names = ("node", "kind", "scheme", "layouts in -> out", "states", "saved", "transient", "comm", "time")
    numeric = {"states", "saved", "transient", "comm", "compute", "comm time", "recompute", "time"}
    rows: list[list[str]] = []
    ckpt = set(plan.checkpoint)
    for a in shown:
        c = a.cost
        if wide:
            node = a.node + (" (ckpt)" if a.block in ckpt else "")
        else:
            node = _cut_front(a.node, _NODE_WIDTH - 1) + ("*" if a.block in ckpt else "")
        kind = a.kind if wide else _KIND_SHORT.get(a.kind, a.kind)
        sizes = [format_bytes(c.state_bytes), format_bytes(c.saved_bytes), format_bytes(c.transient_bytes),
                 format_bytes(c.comm_bytes)]
        if wide:
            rows.append([node, kind, a.scheme, a.strategy, _layouts(a), *sizes, format_seconds(c.compute_s),
                         format_seconds(c.comm_s), format_seconds(c.recompute_s)])
        else:
            rows.append([node, kind, a.scheme, _layouts(a), *sizes,
                         format_seconds(c.compute_s + c.comm_s + c.recompute_s)])
    flexible = {} if wide else {"node": _NODE_WIDTH, "layouts in -> out": 20}  # cut past these widths
    for k, name in enumerate(names):
        cells = [name, footer.get(name, "")] + [r[k] for r in rows]
        table.add_column(name, footer=footer.get(name, ""), justify="right" if name in numeric else "left",
                         no_wrap=True, overflow="ellipsis", max_width=flexible.get(name),
                         min_width=None if name in flexible else max(len(c) for c in cells))
    for r in rows:
        table.add_row(*r)
    return table, len(plan.assignments) - len(shown)


def _redistribution_table(plan: Plan, show_all: bool, limit: int = 20) -> Table:
    rows = sorted(plan.redistributions, key=lambda r: -r.seconds)
    hidden = 0 if show_all else max(0, len(rows) - limit)
    table = Table(title=f"redistributions: {len(rows)}, {format_seconds(sum(r.seconds for r in rows))}, "
                        f"{format_bytes(sum(r.comm_bytes for r in rows))}"
                        + (f" (the {limit} slowest shown; --all shows every one)" if hidden else ""),
                  title_justify="left")
    for name in ("src -> dst", "shape", "from", "to", "steps", "comm", "time"):
        table.add_column(name, justify="right" if name in ("comm", "time") else "left")
    for r in rows[: len(rows) - hidden]:
        table.add_row(f"{r.src} -> {r.dst}", "x".join(map(str, r.shape)), str(r.src_layout), str(r.dst_layout),
                      "; ".join(r.steps) or "-", format_bytes(r.comm_bytes), format_seconds(r.seconds))
    return table


def _not_offered_table(plan: Plan, show_all: bool) -> Table:
    table = Table(title="schemes not offered, and why", title_justify="left")
    if show_all:
        table.add_column("node")
        table.add_column("reason")
        for a in plan.assignments:
            for reason in a.not_offered:
                table.add_row(a.node, reason)
        return table
    first: dict[str, str] = {}
    counts: Counter[str] = Counter()
    for a in plan.assignments:
        for reason in a.not_offered:
            first.setdefault(reason, a.node)
            counts[reason] += 1
    table.add_column("reason")
    table.add_column("ops", justify="right")
    table.add_column("first op")
    for reason, n in counts.most_common():
        table.add_row(reason, str(n), first[reason])
    return table


def explain_renderables(plan: Plan, show_all: bool = False, wide: bool = False) -> list[RenderableType]:
    """What `planner explain` prints, in order: per-op table with totals, redistributions, schemes not
    offered, ops without a parallel strategy. `wide`: every column of the op table, nothing cut."""
    table, hidden = _op_table(plan, show_all, wide)
    out: list[RenderableType] = [table]
    if not wide:
        out.append(Text("time = compute + communication + recompute; transient total = the largest; * = in a "
                        "checkpointed block; --wide shows times apart, the strategy and names in full."))
    if hidden:
        out.append(Text(f"{hidden} ops that follow their input's layout are hidden (--all shows them); "
                        "the totals include them."))
    if plan.redistributions:
        out.append(_redistribution_table(plan, show_all))
    if any(a.not_offered for a in plan.assignments):
        out.append(_not_offered_table(plan, show_all))
    other = [f"{a.node} ({a.target})" for a in plan.assignments if a.kind == "other"]
    if other:
        out.append(Text(f"ops without a parallel strategy, run replicated: {_names(other, 20)}"))
    whole = [f"{a.node} ({a.target})" for a in plan.assignments if a.kind == "opaque"]
    if whole:
        out.append(Text(f"ops run whole on each rank (replicate/fsdp; saved activations estimated): {_names(whole, 20)}"))
    return out
