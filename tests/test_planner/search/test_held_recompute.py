"""The rows for a checkpointed block's forward re-run (`planner.search.held_recompute`), on models this project did
not write: never above what the plan's accounting counts, and closer to it than the rows without them."""

from __future__ import annotations

import random

import pytest

from cost_models.hardware import load_profile
from cost_models.mesh import candidate_meshes
from planner import get_example
from planner.plans.assemble import assemble_plan
from planner.search.build import build_problem
from planner.search.solve.evaluate import held_bytes, held_peak
from planner.search.solve.indexed import IndexedProblem
from planner.search.solve.problem import Solution
from planner.trace.tracer import capture


def _shortfalls(name: str, samples: int, every: bool, peak: bool = False) -> list[int]:
    """Per random assignment on 2x2x2 (every block checkpointed, or each with probability 0.7): the plan's largest
    transient less the largest held row (with `peak`: the plan's bound less the held ILP's peak, `held_peak`)."""
    from zoo import ZOO, build

    ex = build(name) if name in ZOO else get_example(name)
    graph = capture(ex.model, ex.example_inputs, name=name)
    hw = load_profile("a100-80gb")
    built = build_problem(graph, candidate_meshes(8, 8)[-1], hw, 10**12, device=hw.device)
    ip = IndexedProblem(built.problem)
    rng = random.Random(0)
    out = []
    for _ in range(samples):
        choice = [rng.randrange(n) for n in ip.sizes]
        ckpt = [b for b in range(len(ip.block_names)) if every or rng.random() < 0.7]
        sol = Solution(status="feasible", choice=dict(zip(ip.names, choice)), checkpointed=[ip.block_names[b] for b in ckpt])
        plan = assemble_plan(graph, built, sol, hw, budget_bytes=10**12, device=hw.device, bytes_per_param=16,
                             checkpointing=True, schemes=None)
        if peak:
            out.append(plan.predicted.bound_bytes - held_peak(ip, choice, ckpt))
        else:
            out.append(plan.predicted.transient_bytes - held_bytes(ip, choice, ckpt))
    return out


@pytest.mark.parametrize("name", ["hf-llama", "hf-gpt2", "hf-bert", "hf-t5", "hf-vit", "torch-transformer-encoder"])
def test_the_held_rows_never_count_more_than_the_plan(name: str) -> None:
    """Random assignments and checkpointed sets: the largest held row (the forward re-run's among them) is never above
    the plan's largest transient, where the formulas' recompute rows can be (HF ViT, HF T5: up to 35 KiB above)."""
    assert min(_shortfalls(name, 8, every=False)) >= 0


@pytest.mark.parametrize(("name", "most"), [("hf-gpt2", 16_384), ("hf-llama", 882_952)])
def test_the_forward_rerun_rows_count_the_intermediates_the_plan_counts(name: str, most: int) -> None:
    """Every block checkpointed, 16 random assignments: the held rows fall short of the plan's largest transient by
    at most `most` bytes in all (hf-gpt2 172,032 and HF LLaMA 1,341,704 without the forward re-run's rows: its
    peak holds the intermediates still to be read, hf-gpt2's GELU branch 256 KiB at the product, which no row saw,
    beside the gradients alive at the trigger, the MLP dropout's own where it reaches the residual add converted)."""
    short = _shortfalls(name, 16, every=True)
    assert min(short) >= 0 and sum(short) <= most


@pytest.mark.parametrize(("name", "every"), [("gpt-tiny", True), ("hf-vit", False), ("hf-vit", True), ("hf-opt", True),
                                             ("torch-transformer-encoder", False), ("hf-bert", True),
                                             ("hf-bert", False), ("hf-llama", True)])
def test_the_held_ilps_peak_never_exceeds_the_plans_bound(name: str, every: bool) -> None:
    """Random assignments: the peak the held ILP counts is a lower bound of the plan's, so its bounds hold. Where the
    held rows count a block's forward re-run, the ILP leaves the formulas' recompute rows out there
    (`Problem.held_rerun`): they counted each op's whole working set where the plan's re-run holds the forward's,
    up to 12 KiB above the plan's bound on gpt-tiny and 35 KiB on HF ViT (8 of 16 of its assignments)."""
    assert min(_shortfalls(name, 16, every=every, peak=True)) >= 0


@pytest.mark.slow
def test_gpt_tinys_plan_at_its_smallest_budget_on_4x4x4_is_proven_optimal() -> None:
    """gpt-tiny on 4x4x4 at its smallest budget (99,920 B; ~60 s CPU): the held ILP proves 7.5977 ms optimal and the
    plan fits it. The residual stream's gradient, which the MLP projection's output gradient shares unless the
    passthrough through the dropout to the residual add breaks, counts only where it breaks (`HeldBeside.apart`): the
    linear form (its bytes less its most, plus its most where it breaks) made the row 30 KiB below the op's own working
    set, the held ILP found a 3.6845 ms answer 19 KiB over the budget, and the plan was 7.6999 ms, 52 % from the
    bound. (The priced search's answer is 9.8133 ms.)"""
    from cost_models.mesh import Mesh
    from planner import plan

    ex = get_example("gpt-tiny")
    p = plan(ex.model, 99_920, example_inputs=ex.example_inputs, world_size=64, meshes=[Mesh((4, 4, 4))], workers=1)
    assert p.predicted.step_time_s * 1e3 == pytest.approx(7.5977, abs=1e-4)
    assert p.predicted.bound_bytes <= 99_920
    assert p.solver.status == "optimal"
