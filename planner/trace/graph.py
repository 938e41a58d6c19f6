"""The captured model: ops in execution order, their data-flow graph and the model's repeated blocks.

`planner.trace.tracer.capture` builds a `ModelGraph`; the cost model reads its `OpNode`s, the plan builder its blocks,
and the plan records its `fingerprint` so that a plan can be checked against the model it was made for.
`gm` keeps the traced `torch.fx.GraphModule` for the rewrite that applies a plan: every `OpNode.name` is
the name of an FX node of `gm`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import networkx as nx

from cost_models.errors import PlannerError
from cost_models.ops import OpNode, ParamInfo, TensorMeta

__all__ = ["BlockInfo", "ModelGraph", "graph_fingerprint", "GraphError"]


class GraphError(PlannerError, ValueError):
    """A lookup of a node that is not in the graph, or a malformed serialised graph."""


@dataclass(frozen=True)
class BlockInfo:
    """One repeated block of the model (a child of an nn.ModuleList / nn.Sequential with an integer name).

    name: the block module's qualified name, e.g. "transformer.h.0".
    nodes: names of the ops that run inside it, in execution order.
    cls: equal for blocks that are structurally identical (same op kinds, targets, shapes, parameter
        shapes and attributes, in the same order, wired the same way), so a solver may treat them as
        copies of one another.
    """

    name: str
    nodes: list[str]
    cls: str


@dataclass
class ModelGraph:
    """A captured model (see the module docstring); build it with `ModelGraph.build`."""

    name: str
    nodes: list[OpNode]
    graph: nx.DiGraph
    blocks: list[BlockInfo]
    fingerprint: str
    method: str  # "fx" or "export"
    gm: Any = field(default=None, repr=False, compare=False)
    """The traced torch.fx.GraphModule (export: the ExportedProgram's graph module); not serialised."""
    program: Any = field(default=None, repr=False, compare=False)
    """The torch.export.ExportedProgram when method == "export" (its graph signature maps parameter
    placeholders of `gm` to state_dict names); None for fx."""

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}

    @classmethod
    def build(cls, name: str, nodes: list[OpNode], blocks: list[BlockInfo], method: str,
              gm: Any = None) -> ModelGraph:
        """Assemble a graph: derives the networkx edges and the fingerprint from `nodes`."""
        return cls(name=name, nodes=nodes, graph=_digraph(nodes), blocks=blocks,
                   fingerprint=graph_fingerprint(nodes), method=method, gm=gm)

    # --- lookups -------------------------------------------------------------------------------
    def node(self, name: str) -> OpNode:
        """The op called `name`."""
        try:
            return self._by_name[name]
        except KeyError:
            raise GraphError(f"no op named {name!r} in graph {self.name!r}") from None

    def consumers(self, name: str) -> list[OpNode]:
        """Ops that read `name`'s output, in execution order."""
        self.node(name)
        succ = set(self.graph.successors(name))
        return [n for n in self.nodes if n.name in succ]

    def producers(self, name: str) -> list[OpNode]:
        """Ops whose outputs `name` reads, in the order of its inputs (each once)."""
        return [self.node(p) for p in dict.fromkeys(self.node(name).inputs)]

    def input_sizes(self) -> list[tuple[tuple[int, ...], int]]:
        """(shape, itemsize) of each input the caller passes: what the optimizer step holds beside the states
        (`cost_models.optimizer.optimizer_step_bytes`), for the plan's bound and the solver's row alike."""
        return [(tuple(n.out.shape), n.out.itemsize) for n in self.nodes if n.kind == "input"]

    def block(self, name: str) -> BlockInfo:
        """The block called `name`."""
        for b in self.blocks:
            if b.name == name:
                return b
        raise GraphError(f"no block named {name!r} in graph {self.name!r}; blocks: {[b.name for b in self.blocks]}")

    def shared_params(self) -> dict[str, list[str]]:
        """Parameters used by more than one op (tied weights), name -> the ops that use it."""
        users: dict[str, list[str]] = {}
        for n in self.nodes:
            for p in n.params:
                users.setdefault(p.name, []).append(n.name)
        return {k: v for k, v in users.items() if len(v) > 1}

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[OpNode]:
        return iter(self.nodes)

    def param_numel(self) -> int:
        """Number of parameter elements, each parameter counted once."""
        seen: dict[str, int] = {}
        for n in self.nodes:
            for p in n.params:
                seen[p.name] = p.numel
        return sum(seen.values())

    def summary(self) -> str:
        """A few readable lines: op counts per kind, parameters and blocks."""
        kinds = Counter(n.kind for n in self.nodes)
        lines = [f"{self.name} ({self.method}): {len(self.nodes)} ops, {self.param_numel():,} parameters, "
                 f"fingerprint {self.fingerprint[:12]}",
                 "  ops: " + ", ".join(f"{k} {c}" for k, c in sorted(kinds.items(), key=lambda kc: (-kc[1], kc[0])))]
        if self.blocks:
            classes = Counter(b.cls for b in self.blocks)
            lines.append(f"  blocks: {len(self.blocks)} ({self.blocks[0].name} ... {self.blocks[-1].name}), "
                         f"{len(classes)} class(es): " + ", ".join(f"{c} x{k}" for c, k in classes.items()))
        else:
            lines.append("  blocks: none")
        return "\n".join(lines)

    # --- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything but `gm` (edges are derived from the nodes again on load)."""
        return {"name": self.name, "method": self.method, "fingerprint": self.fingerprint,
                "nodes": [_node_dict(n) for n in self.nodes],
                "blocks": [{"name": b.name, "nodes": list(b.nodes), "cls": b.cls} for b in self.blocks]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelGraph:
        """Inverse of `to_dict` (without `gm`); raises GraphError if the fingerprint does not match."""
        try:
            nodes = [_node_from_dict(d) for d in data["nodes"]]
            blocks = [BlockInfo(b["name"], list(b["nodes"]), b["cls"]) for b in data["blocks"]]
            graph = cls.build(data["name"], nodes, blocks, data["method"])
        except (KeyError, TypeError) as e:
            raise GraphError(f"malformed serialised graph: missing or bad field {e}; "
                             f"pass the dict ModelGraph.to_dict() produced") from None
        if graph.fingerprint != data["fingerprint"]:
            raise GraphError(f"serialised graph {data['name']!r} does not match its fingerprint "
                             f"({data['fingerprint'][:12]} stored, {graph.fingerprint[:12]} recomputed)")
        return graph


def graph_fingerprint(nodes: list[OpNode]) -> str:
    """sha256 hex digest of a canonical text of the ops (kind, target, inputs, shapes, dtypes, params,
    module path, block, attrs). Depends only on the captured graph, so it is the same in every process."""
    h = hashlib.sha256()
    for n in nodes:
        h.update(json.dumps(_node_dict(n), sort_keys=True, separators=(",", ":"), default=repr).encode())
        h.update(b"\n")
    return h.hexdigest()


def _digraph(nodes: list[OpNode]) -> nx.DiGraph:
    """producer -> consumer edges; `arg` is the first index of the producer in the consumer's inputs."""
    g = nx.DiGraph()
    for n in nodes:
        g.add_node(n.name)
    for n in nodes:
        for i, src in enumerate(n.inputs):
            if not g.has_edge(src, n.name):
                g.add_edge(src, n.name, arg=i)
    return g


def _node_dict(n: OpNode) -> dict[str, Any]:
    d = asdict(n)
    d["attrs"] = _jsonable(n.attrs)
    return d


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _tupled(value: Any) -> Any:
    """JSON lists back to the tuples capture writes into attrs."""
    if isinstance(value, dict):
        return {k: _tupled(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tupled(v) for v in value)
    return value


def _meta(d: dict[str, Any]) -> TensorMeta:
    return TensorMeta(tuple(d["shape"]), d["dtype"])


def _node_from_dict(d: dict[str, Any]) -> OpNode:
    return OpNode(
        name=d["name"], kind=d["kind"], target=d["target"], inputs=list(d["inputs"]),
        input_meta=[_meta(m) for m in d["input_meta"]], outputs=[_meta(m) for m in d["outputs"]],
        params=[ParamInfo(p["name"], tuple(p["shape"]), p["dtype"], p["role"]) for p in d["params"]],
        module_path=d["module_path"], block=d["block"], attrs=_tupled(d["attrs"]),
    )
