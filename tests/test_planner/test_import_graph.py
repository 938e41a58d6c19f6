"""planner/ is laid out in stages that import only the stages before them: no module imported in a circle,
no arrow back (docs/import_graph.py draws the graph ARCHITECTURE.md shows)."""

from __future__ import annotations

import importlib.util

import networkx as nx
from paths import ROOT as REPO_ROOT

ROOT = REPO_ROOT


def _graph_module():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "docs" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_circle_and_no_arrow_back() -> None:
    ig = _graph_module()
    g = ig.build()
    assert g.number_of_nodes() > 50
    assert list(nx.simple_cycles(g)) == []
    back = [(a, b) for a, b in g.edges if ig.STAGES.index(ig.stage_of(b)) > ig.STAGES.index(ig.stage_of(a))]
    assert back == [], back


def test_the_check_sees_an_arrow_back() -> None:
    """The check is not vacuous: a trace module importing the CLI is reported."""
    ig = _graph_module()
    g = ig.build()
    g.add_edge("planner.trace.graph", "planner.cli.app")
    back = [(a, b) for a, b in g.edges if ig.STAGES.index(ig.stage_of(b)) > ig.STAGES.index(ig.stage_of(a))]
    assert back == [("planner.trace.graph", "planner.cli.app")]
