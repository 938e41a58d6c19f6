"""Plans follow the measured numbers: a profile whose link between nodes is much slower (as `planner
calibrate` finds it when the nodes talk over a slow network) makes the planner move its heavy collectives
onto the fast link. Small and fast: a two-layer MLP on a 2x2 mesh of 2 nodes x 2 ranks."""

from __future__ import annotations

import dataclasses

import pytest

from cost_models.comm import link_of
from cost_models.hardware import HardwareProfile, load_profile
from cost_models.mesh import Mesh
from cost_models.strategies import op_cost
from planner.api import plan
from planner.models.loading import get_example
from planner.plans.format import Plan
from planner.trace.graph import ModelGraph
from planner.trace.tracer import capture

# Axis x crosses the two nodes (inter), axis y stays inside one (intra).
MESH = Mesh((2, 2), ("x", "y"), ranks_per_node=2)


def _link_bytes(p: Plan, graph: ModelGraph, hw: HardwareProfile) -> dict[str, int]:
    """Bytes of the ops' own collectives per link, forward and backward, of plan `p`."""
    out = {"intra": 0, "inter": 0}
    for a in p.assignments:
        cost = op_cost(graph.node(a.node), a.to_strategy(), p.mesh, hw, device=p.options.device)
        for c in cost.collectives:
            if p.mesh.size(c.axes) > 1:
                out[link_of(c.axes, p.mesh)] += c.bytes
    return out


@pytest.fixture(scope="module")
def graph() -> ModelGraph:
    # Weights (512 x 2048 fp32: 4 MiB) dwarf the activations (64 x 512 fp32: 128 KiB): the gradient
    # all-reduces of data parallelism are the heavy collectives, the activation ones of 1d are light.
    ex = get_example("mlp", dim=512, hidden=2048, n_layer=2, batch_size=64)
    return capture(ex.model, ex.example_inputs)


def test_a_slow_link_between_nodes_gets_the_light_collectives(graph: ModelGraph) -> None:
    even = dataclasses.replace(load_profile("cpu-gloo"), name="even", gpus_per_node=2)
    slow = dataclasses.replace(even, name="slow-inter", inter_alpha=10 * even.inter_alpha,
                               inter_beta=100 * even.inter_beta)
    plans = {hw.name: plan(graph, "40MiB", world_size=4, hardware=hw, meshes=[MESH], workers=1)
             for hw in (even, slow)}
    moved = {name: _link_bytes(p, graph, slow) for name, p in plans.items()}
    # (40 MiB: room for the reduce-scattered dW chains the linears price; no time limit: work-limited, the same
    # plan on a loaded machine.) Equal links: nothing to avoid. A 100x slower inter link: the plan sends strictly fewer bytes over it
    # and is faster, priced on the slow profile, than the plan made without knowing.
    assert moved["slow-inter"]["inter"] < moved["even"]["inter"]
    assert moved["slow-inter"]["inter"] < moved["slow-inter"]["intra"]
    comm = {name: sum(op_cost(graph.node(a.node), a.to_strategy(), MESH, slow, device="cpu").comm_s
                      for a in p.assignments) for name, p in plans.items()}
    assert comm["slow-inter"] < comm["even"]
