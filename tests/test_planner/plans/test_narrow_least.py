"""A mesh where nothing fits learns the least-memory plan's bound; solves just below it, looking for a smaller
budget (`planner.plans.meshes.narrow_least`), run only when no mesh has a plan: the smallest budget is then
what the user is told, and otherwise it is never used.

gpt-tiny on 8 ranks at 454,288 B (about its smallest budget): the (8,) mesh has a plan; on 2x2x2 the plan's
accounting counts 36,864 B more than the solver's model for the least-memory answer, so that mesh's smallest
budget is worth narrowing, but not here (the two narrowing solves took 13.5 s of a 24 s plan)."""

from __future__ import annotations

import json

import pytest

import planner.api
from cost_models.mesh import Mesh
from planner import InfeasibleError, get_example, plan
from planner.trace.tracer import capture

BUDGET = 454_288
MESHES = [Mesh((8,)), Mesh((2, 2, 2))]


@pytest.fixture(scope="module")
def graph():
    ex = get_example("gpt-tiny")
    return capture(ex.model, ex.example_inputs, name="gpt-tiny")


def _text(p) -> str:
    out = json.loads(p.to_json())
    out["solver"].pop("seconds")
    return json.dumps(out, sort_keys=True)


def test_no_narrowing_when_another_mesh_has_a_plan(graph, monkeypatch: pytest.MonkeyPatch) -> None:
    narrowed: list[Mesh] = []
    narrow_least = planner.api.narrow_least

    def recording(mesh, *args, **kwargs):
        narrowed.append(mesh)
        return narrow_least(mesh, *args, **kwargs)

    monkeypatch.setattr(planner.api, "narrow_least", recording)
    both = plan(graph, BUDGET, world_size=8, workers=1, meshes=MESHES)
    assert narrowed == []
    alone = plan(graph, BUDGET, world_size=8, workers=1, meshes=MESHES[:1])
    assert both.mesh == MESHES[0] and _text(both) == _text(alone)  # the same plan as without the other mesh
    with pytest.raises(InfeasibleError) as err:  # where no mesh has a plan, both narrow (on (8,) too the
        plan(graph, 1, world_size=8, workers=1, meshes=MESHES)  # plan counts 16,384 B more than the solver)
    assert sorted(map(str, narrowed)) == sorted(map(str, MESHES)) and err.value.min_budget_bytes <= BUDGET
