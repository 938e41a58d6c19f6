"""Pictures of plans for notebooks and reports: which scheme each op of each block got, and where the memory goes.

    from planner.cli.plots import scheme_map_figure, memory_figure
    scheme_map_figure([plan_a, plan_b], titles=["16 GiB", "8 GiB"])   # one panel per plan
    memory_figure([plan_a, plan_b], labels=["16 GiB", "8 GiB"])        # stacked bars per plan

Both return a `matplotlib.figure.Figure` built without pyplot (no global state, no display needed); a
notebook shows it with `display(fig)`, a script writes it with `fig.savefig(path)`. The frontier picture
(step time against budget, with the uniform-scheme baselines) is `planner.cli.frontier.frontier_figure`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from cost_models.family import map_kinds
from cost_models.schemes import Scheme
from planner.plans.format import Assignment, Plan
from planner.units import format_bytes

__all__ = ["SCHEME_COLORS", "OpCell", "scheme_cells", "scheme_map_figure", "memory_figure", "byte_unit"]

# One colour per scheme, shared with the frontier plot (1d_col and 1d_row are two shades of the "1d" blue).
_NAMED_COLORS = {
    Scheme.REPLICATE: "tab:gray", Scheme.FSDP: "tab:brown", Scheme.ONE_D_COL: "tab:blue",
    Scheme.ONE_D_ROW: "lightskyblue", Scheme.TWO_D: "tab:green", Scheme.THREE_D: "tab:red",
    Scheme.THREE_D_ALLREDUCE: "tab:purple", Scheme.VOCAB: "tab:olive", Scheme.SEQ: "tab:orange",
    Scheme.FOLLOW: "whitesmoke",
}
# A scheme added to the enum without a colour of its own takes the next spare one (so a new scheme is
# drawn, and distinguishable, without editing this file).
_SPARE_COLORS = itertools.cycle(("tab:pink", "tab:cyan", "gold", "black", "navy", "lime"))
SCHEME_COLORS: dict[str, str] = {**{s.value: c for s, c in _NAMED_COLORS.items()},
                                 **{s.value: next(_SPARE_COLORS) for s in Scheme if s not in _NAMED_COLORS}}
_OUTSIDE = "outside blocks"
_HATCH = "////"
_NO_LIMIT = 2**59  # budgets at or above this mean "unlimited" (the frontier's probe): no budget tick is drawn


@dataclass(frozen=True)
class OpCell:
    """One cell of the scheme map: the row (a block, or "outside blocks"), the op's role (its module path
    inside the block, e.g. "attn.c_attn"; functional ops get their kind and a number), the scheme and
    whether the op's block is checkpointed."""

    row: str
    role: str
    scheme: str
    checkpointed: bool
    node: str



def _is_dark(color: str) -> bool:
    """Whether text on `color` reads better in white (relative luminance below one half)."""
    r, g, b = to_rgb(color)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5

def _role(a: Assignment, seen: dict[tuple[str, str], int]) -> str:
    prefix = f"{a.block}." if a.block else ""
    path = a.module_path[len(prefix):] if a.module_path.startswith(prefix) else a.module_path
    if a.block and a.module_path == a.block:
        path = ""
    if a.target.startswith("nn."):  # a module call: its own path names it
        return path or a.node
    key = (a.block or _OUTSIDE, f"{path}.{a.kind}" if path else a.kind)
    n = seen.get(key, 0)
    seen[key] = n + 1
    return key[1] if n == 0 else f"{key[1]}[{n}]"


def scheme_cells(plan: Plan) -> list[OpCell]:
    """The ops of `plan` the scheme map shows (embeddings, layer norms, linears, attention matmuls and softmax,
    the loss), in graph order, each with its row and role."""
    seen: dict[tuple[str, str], int] = {}
    ckpt = set(plan.checkpoint)
    shown = map_kinds()  # the ops whose scheme is a real choice (their neighbours follow them)
    return [OpCell(a.block or _OUTSIDE, _role(a, seen), a.scheme, a.block in ckpt, a.node)
            for a in plan.assignments if a.kind in shown]


def _ordered(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _grid(plans: Sequence[Plan]) -> tuple[list[str], list[str]]:
    """Columns: roles outside blocks that come before the first block, the block roles, then the rest."""
    before: list[str] = []
    inside: list[str] = []
    after: list[str] = []
    for p in plans:
        started = False
        for c in scheme_cells(p):
            if c.row != _OUTSIDE:
                started = True
                inside.append(c.role)
            else:
                (after if started else before).append(c.role)
    return _ordered(before), _ordered(inside) + [r for r in _ordered(after) if r not in before]


def scheme_map_figure(plans: Sequence[Plan], titles: Sequence[str] | None = None) -> Figure:
    """One panel per plan: rows are the blocks (plus one row for the ops outside blocks), columns the op
    roles, each cell coloured (and labelled) by the op's scheme; checkpointed blocks are hatched."""
    if not plans:
        raise ValueError("scheme_map_figure needs at least one plan")
    titles = list(titles) if titles is not None else [
        "no budget limit" if p.budget_bytes >= _NO_LIMIT else f"budget {format_bytes(p.budget_bytes)}" for p in plans]
    if len(titles) != len(plans):
        raise ValueError(f"got {len(titles)} titles for {len(plans)} plans; give one title per plan")
    before, columns = _grid(plans)
    columns = before + columns
    rows_per_plan = [_ordered([c.row for c in scheme_cells(p) if c.row != _OUTSIDE]) + [_OUTSIDE] for p in plans]
    n_rows = max(len(r) for r in rows_per_plan)
    fig = Figure(figsize=(max(7.0, 0.75 * len(columns) + 2.5), (0.45 * n_rows + 0.5) * len(plans) + 1.6),
                 layout="constrained")
    axes = fig.subplots(len(plans), 1, squeeze=False)[:, 0]
    used: set[str] = set()
    for k, (ax, plan, title, rows) in enumerate(zip(axes, plans, titles, rows_per_plan)):
        col_of = {r: i for i, r in enumerate(columns)}
        row_of = {r: i for i, r in enumerate(rows)}
        for c in scheme_cells(plan):
            x, y = col_of[c.role], row_of[c.row]
            used.add(c.scheme)
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor=SCHEME_COLORS.get(c.scheme, "white"), edgecolor="white",
                                   hatch=_HATCH if c.checkpointed else None, linewidth=1.5))
            dark = _is_dark(SCHEME_COLORS.get(c.scheme, "white")) and not c.checkpointed
            ax.text(x + 0.5, y + 0.5, c.scheme.replace("_", "\n", 1) if c.scheme == Scheme.THREE_D_ALLREDUCE else c.scheme,
                    ha="center", va="center", fontsize=7, color="white" if dark else "black",
                    bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85)
                    if c.checkpointed else None)
        ckpt = set(plan.checkpoint)
        ax.set_xlim(0, len(columns))
        ax.set_ylim(len(rows), 0)
        bottom = k == len(plans) - 1  # the panels share their columns: name them once, under the last one
        ax.set_xticks([i + 0.5 for i in range(len(columns))], columns if bottom else [], rotation=40, ha="right",
                      fontsize=8)
        ax.set_yticks([i + 0.5 for i in range(len(rows))],
                      [f"{r} (ckpt)" if r in ckpt else r for r in rows], fontsize=8)
        if bottom:
            ax.set_xlabel("op (module path inside the block; functional ops by kind)")
        ax.set_ylabel("block")
        ax.set_title(title, loc="left", fontsize=10)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    handles = [Patch(facecolor=SCHEME_COLORS.get(s, "white"), edgecolor="gray", label=s)
               for s in SCHEME_COLORS if s in used]
    handles.append(Patch(facecolor="white", edgecolor="gray", hatch=_HATCH, label="checkpointed block"))
    fig.legend(handles=handles, loc="outside right upper", title="scheme", fontsize="small")
    return fig


def byte_unit(largest: float) -> tuple[str, int]:
    """The binary unit (name, bytes) that shows `largest` bytes as a number between 1 and 1024."""
    for name, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= size:
            return name, size
    return "B", 1


def memory_figure(plans: Sequence[Plan], labels: Sequence[str] | None = None) -> Figure:
    """Predicted memory per rank of each plan as stacked bars (model states, saved activations, largest
    transient buffer: the bound the budget is checked against), the predicted peak (what is alive together
    at the step's fullest point, below the bound) as a red tick, and each plan's budget as a black tick
    across its bar (none for an unlimited budget)."""
    if not plans:
        raise ValueError("memory_figure needs at least one plan")
    labels = list(labels) if labels is not None else [f"plan {i}" for i in range(len(plans))]
    if len(labels) != len(plans):
        raise ValueError(f"got {len(labels)} labels for {len(plans)} plans; give one label per plan")
    budgets = [p.budget_bytes if p.budget_bytes < _NO_LIMIT else None for p in plans]
    unit, scale = byte_unit(max([p.predicted.bound_bytes for p in plans] + [b for b in budgets if b]))
    parts = (("model states", "model_state_bytes", "tab:blue"), ("saved activations", "activation_bytes", "tab:orange"),
             ("transient", "transient_bytes", "tab:green"))
    fig = Figure(figsize=(max(6.0, 1.3 * len(plans) + 3.0), 4.5), layout="constrained")
    ax = fig.add_subplot()
    xs = list(range(len(plans)))
    bottom = [0.0] * len(plans)
    for name, field, color in parts:
        heights = [getattr(p.predicted, field) / scale for p in plans]
        ax.bar(xs, heights, bottom=bottom, color=color, label=name, width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights)]
    # where the optimizer step holds more beside the states than the backward's activations + transient
    beyond = [max(0, p.predicted.bound_bytes / scale - b) for p, b in zip(plans, bottom)]
    if any(beyond):
        ax.bar(xs, beyond, bottom=bottom, color="tab:purple", label="optimizer step beyond", width=0.6)
    ax.hlines([p.predicted.peak_memory_bytes / scale for p in plans], [x - 0.3 for x in xs], [x + 0.3 for x in xs],
              colors="tab:red", linewidth=2, label="predicted peak")
    shown = [(x, b / scale) for x, b in zip(xs, budgets) if b is not None]
    if shown:
        ax.hlines([b for _, b in shown], [x - 0.4 for x, _ in shown], [x + 0.4 for x, _ in shown], colors="black",
                  linewidth=2, label="budget")
    ax.set_xticks(xs, labels)
    ax.set_xlabel("plan")
    ax.set_ylabel(f"predicted memory per rank ({unit})")
    ax.set_title("memory per rank: model states + saved activations + transient, and the peak", loc="left",
                 fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    order = sorted(range(len(names)), key=lambda i: (names[i] == "budget", names[i] == "predicted peak"))
    ax.legend([handles[i] for i in order], [names[i] for i in order], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize="small")
    return fig
