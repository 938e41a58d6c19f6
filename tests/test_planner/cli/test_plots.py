"""planner.cli.plots and the frontier figure: every picture has labelled axes and a legend, and shows the plan's
own numbers (one cell per mapped op, hatched exactly where the block is checkpointed; bars that add up to
the predicted peak)."""

from __future__ import annotations

import pytest
from matplotlib.patches import Rectangle
from plan_examples import make_plan

from cost_models.mesh import Mesh
from planner.api import InfeasibleError, plan
from planner.cli.frontier import Curve, frontier_figure
from planner.cli.plots import byte_unit, memory_figure, scheme_cells, scheme_map_figure
from planner.models import get_example
from planner.plans.format import Plan

FLAT = [Mesh((8,))]  # 1d on the flat mesh plans gpt-tiny in well under a second


@pytest.fixture(scope="module")
def tiny_plans() -> list[Plan]:
    """gpt-tiny on 8 ranks in 1d: the fastest plan, and the plan at the smallest budget (blocks checkpointed)."""
    ex = get_example("gpt-tiny")

    def plan_1d(budget: int) -> Plan:
        return plan(ex.model, budget, world_size=8, example_inputs=ex.example_inputs, meshes=FLAT, schemes=["1d"])

    fastest = plan_1d(2**60)
    with pytest.raises(InfeasibleError) as e:
        plan_1d(1)
    tight = plan_1d(e.value.min_budget_bytes)
    return [tight, fastest]


def _labelled(ax) -> None:
    assert ax.get_xlabel() and ax.get_ylabel()


def test_scheme_cells_name_block_roles():
    cells = scheme_cells(make_plan())
    assert [(c.row, c.role, c.scheme, c.checkpointed) for c in cells] == [
        ("outside blocks", "wte", "vocab", False), ("h.0", "fc", "3d", True), ("h.0", "proj", "3d", True)]


def test_scheme_map_has_one_cell_per_op_hatched_where_checkpointed(tiny_plans):
    tight, fastest = tiny_plans
    assert tight.checkpoint, "the smallest budget should need checkpointing"
    fig = scheme_map_figure(tiny_plans, titles=["tight", "fastest"])
    axes = fig.axes
    assert len(axes) == 2
    assert axes[-1].get_xlabel()  # the panels share their columns, named under the last one
    for ax, p in zip(axes, tiny_plans):
        assert ax.get_ylabel() and ax.get_title(loc="left")
        cells = [a for a in ax.patches if isinstance(a, Rectangle)]
        expected = scheme_cells(p)
        assert len(cells) == len(expected)
        assert sum(bool(r.get_hatch()) for r in cells) == sum(c.checkpointed for c in expected)
        rows = [t.get_text() for t in ax.get_yticklabels()]
        assert rows[-1] == "outside blocks"
        assert {r.removesuffix(" (ckpt)") for r in rows if r.endswith("(ckpt)")} == set(p.checkpoint)
        # the two blocks of gpt-tiny have the same roles: attention and MLP linears, layer norms, matmuls
        assert {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "ln_1", "ln_2"} <= {
            t.get_text() for t in axes[-1].get_xticklabels()}
    legend = fig.legends[0]
    names = {t.get_text() for t in legend.get_texts()}
    assert "checkpointed block" in names
    assert {c.scheme for p in tiny_plans for c in scheme_cells(p)} <= names


def test_scheme_map_refuses_mismatched_titles():
    with pytest.raises(ValueError, match="one title per plan"):
        scheme_map_figure([make_plan()], titles=["a", "b"])


def test_memory_bars_add_up_to_the_bound(tiny_plans):
    fig = memory_figure(tiny_plans, labels=["tight", "fastest"])
    ax = fig.axes[0]
    _labelled(ax)
    unit, scale = byte_unit(max(p.predicted.bound_bytes for p in tiny_plans))
    assert unit in ax.get_ylabel()
    bars = [r for r in ax.patches if isinstance(r, Rectangle)]
    assert len(bars) == 3 * len(tiny_plans)  # states, activations, transient per plan
    for i, p in enumerate(tiny_plans):
        top = max(r.get_y() + r.get_height() for r in bars[i::len(tiny_plans)])
        assert top == pytest.approx(p.predicted.bound_bytes / scale, rel=1e-9)
        assert p.predicted.peak_memory_bytes <= p.predicted.bound_bytes
    names = [t.get_text() for t in ax.get_legend().get_texts()]
    assert names == ["model states", "saved activations", "transient", "predicted peak", "budget"]


def test_byte_unit():
    assert byte_unit(512) == ("B", 1)
    assert byte_unit(3 * 2**20) == ("MiB", 2**20)
    assert byte_unit(2**30) == ("GiB", 2**30)


def test_frontier_figure_labels_and_time_unit(tiny_plans):
    tight, fastest = tiny_plans
    planner_curve = Curve("planner", [(tight.budget_bytes, tight), (fastest.predicted.peak_memory_bytes, fastest)])
    baseline = Curve("1d (ckpt)", [(tight.budget_bytes, None), (fastest.predicted.peak_memory_bytes, fastest)])
    fig = frontier_figure("gpt-tiny", planner_curve, [baseline])
    ax = fig.axes[0]
    _labelled(ax)
    assert "log scale" in ax.get_xlabel()
    # gpt-tiny steps take microseconds to milliseconds: the axis unit follows, so tick labels are not 0.0000x
    assert ax.get_ylabel().endswith(("(ms)", "(µs)"))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["1d (ckpt)", "planner"]
