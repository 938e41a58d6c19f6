"""Time to cost every op x strategy of GPT-3 175B (96 layers, captured on the meta device) on 64 ranks.

For each mesh (64, 8x8, 4x4x4) the ops are walked in order as the plan builder does: each op's input
candidates are the output layouts its producers' strategies can produce; its strategies are enumerated
and every strategy is priced with `op_cost`. Ops of identical blocks have equal (signature, candidates)
keys, so one representative per key is costed and its costs stand for the others (op costs are pure
functions of kind, shapes, attrs, strategy, mesh and hardware). Capture time is not part of the figure.

    python bench/cost_time.py            # goal: < 2 s for the three meshes together
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.hardware import load_profile  # noqa: E402
from cost_models.layout import Layout  # noqa: E402
from cost_models.mesh import Mesh  # noqa: E402
from cost_models.ops import OpNode  # noqa: E402
from cost_models.strategies import enumerate_strategies, mark_graph_hints, op_cost, op_signature  # noqa: E402


def gpt3_ops() -> list[OpNode]:
    from planner.models.gpt import build_gpt
    from planner.trace.tracer import capture

    model, example = build_gpt("gpt3-175b", device="meta")
    ops = list(capture(model, example))
    mark_graph_hints(ops)
    return ops


def cost_all(ops: list[OpNode], mesh: Mesh, hw_name: str = "h100-80gb") -> dict[str, int]:
    """Enumerate and price every op x strategy on `mesh`; returns counts."""
    hw = load_profile(hw_name)
    outs: dict[str, int] = {}      # op name -> id of the list of output layouts its strategies produce
    lists: dict[tuple, int] = {}   # that list (by content) -> its id
    done: dict[tuple, int] = {}    # (signature, producers' list ids) -> list id
    layouts: list[list[tuple[Layout, ...]]] = []
    pairs = priced = 0
    for op in ops:
        index = op.attrs.get("index") if op.kind == "getitem" and isinstance(op.attrs.get("index"), int) else 0
        # Candidates follow from the producers' output lists: key on their ids, so identical layers share.
        key = (op_signature(op), tuple(outs.get(src, -1) for src in op.inputs), index)
        if key not in done:
            cands: list[list[Layout]] = []
            for src_list in key[1]:
                seen: dict[Layout, None] = {}
                for outs_of_one in (layouts[src_list] if src_list >= 0 else []):
                    seen[outs_of_one[index] if len(outs_of_one) > 1 else outs_of_one[0]] = None
                cands.append(list(seen))
            strategies, _ = enumerate_strategies(op, mesh, cands)
            for st in strategies:
                op_cost(op, st, mesh, hw)
            priced += len(strategies)
            produced = tuple(st.outputs for st in strategies)
            if produced not in lists:
                lists[produced] = len(layouts)
                layouts.append(list(produced))
            done[key] = lists[produced]
        outs[op.name] = done[key]
        pairs += len(layouts[done[key]])
    return {"ops": len(ops), "pairs": pairs, "priced": priced, "classes": len(done)}


def main() -> None:
    ops = gpt3_ops()
    meshes = [Mesh((64,)), Mesh((8, 8)), Mesh((4, 4, 4))]
    wall = cpu = 0.0
    for mesh in meshes:
        t0, c0 = time.perf_counter(), time.process_time()
        n = cost_all(ops, mesh)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        wall, cpu = wall + dt, cpu + dc
        print(f"mesh {str(mesh):14s} {n['ops']} ops, {n['pairs']} op x strategy pairs "
              f"({n['classes']} distinct ops, {n['priced']} priced): {dt:.2f} s wall, {dc:.2f} s cpu")
    # CPU time is the figure to compare with the goal on a shared machine; wall time includes waiting.
    print(f"total {wall:.2f} s wall, {cpu:.2f} s cpu for {len(meshes)} meshes (goal < 2 s)")


if __name__ == "__main__":
    main()
