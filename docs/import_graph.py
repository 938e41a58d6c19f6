"""The import graph of `planner/`, generated from the code: stages, the arrows between them, and any circle.

    python docs/import_graph.py            # print the stage graph (mermaid) and check it
    python docs/import_graph.py --modules  # also list every module-level arrow

Every `import planner...` / `from planner... import` statement counts, at module level or inside a function
(a lazy import is still a dependency). The check fails (exit 1) when a module is imported in a circle or
when an arrow points back against the stage order below; docs/ARCHITECTURE.md embeds its output.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
# The data flows this way; a stage may import any stage before it, never one after it. "base" holds the
# helpers every stage shares (units, models, the package's lazy exports), "api" the public `plan()`.
STAGES = ("base", "trace", "search", "plans", "apply", "verify", "calibrate", "api", "cli")
_BASE = {"units", "models", "__init__", "__main__"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "base"
    head = parts[1]
    if head in _BASE:
        return "base" if head != "__main__" else "cli"
    return head if head in STAGES else "base"


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The planner modules `path` imports (a `from pkg import name` of a submodule counts as that module)."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            while n and n not in modules:
                n = n.rpartition(".")[0]
            if n and n.startswith("planner"):
                out.add(n)
    return out


def build() -> nx.DiGraph:
    paths = sorted((ROOT / "planner").rglob("*.py"))
    modules = {module_name(p) for p in paths}
    g = nx.DiGraph()
    for p in paths:
        m = module_name(p)
        g.add_node(m)
        for dep in imports_of(p, modules):
            # a package's own __init__ is not an arrow worth drawing
            if dep != m and not m.startswith(dep + ".") or dep == "planner" and m != "planner":
                if dep == "planner":
                    continue
                g.add_edge(m, dep)
    return g


def main() -> int:
    g = build()
    stages = nx.DiGraph()
    for a, b in g.edges:
        sa, sb = stage_of(a), stage_of(b)
        if sa != sb:
            stages.add_edge(sa, sb)
    print("```mermaid\nflowchart LR")
    for a, b in sorted(stages.edges, key=lambda e: (STAGES.index(e[0]), STAGES.index(e[1]))):
        print(f"  {a} --> {b}")
    print("```")
    if "--modules" in sys.argv:
        for a, b in sorted(g.edges):
            print(f"{a} -> {b}")
    bad = 0
    for cycle in nx.simple_cycles(g):
        print(f"CIRCLE: {' -> '.join(cycle + cycle[:1])}")
        bad += 1
    for a, b in sorted(g.edges):
        sa, sb = stage_of(a), stage_of(b)
        if STAGES.index(sb) > STAGES.index(sa):
            print(f"BACK ARROW: {a} ({sa}) imports {b} ({sb})")
            bad += 1
    print(f"{g.number_of_nodes()} modules, {g.number_of_edges()} arrows; "
          + ("no circle, no arrow back" if not bad else f"{bad} problems"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
