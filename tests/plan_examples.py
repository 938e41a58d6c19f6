"""A small hand-made plan whose numbers obey the accounting contract of `planner.plans.format`.

Two GPT-style MLP linears (768 -> 3072 -> 768, tokens 8 x 128) in 3D on a 2x2x2 mesh with a GELU between
them, in block "h.0", which is checkpointed; an embedding outside the block; one redistribution. The
per-op numbers are made up but consistent: the `predicted` totals are computed from them by hand below.
"""

from __future__ import annotations

from cost_models.layout import Layout
from cost_models.mesh import Mesh
from planner.plans.format import (
    Assignment,
    AssignmentCost,
    ModelInfo,
    OpPrediction,
    Plan,
    PlanOptions,
    Predicted,
    Redistribution,
    SolverInfo,
)

__all__ = ["make_plan"]

MESH = Mesh((2, 2, 2), ("x", "y", "z"), ranks_per_node=8)
# 3D linear with roles (w, i, o) = (x, y, z): x arrives tokens/(x, y), K/z; leaves tokens/(x, z), N/y.
FC_IN = Layout(((), ("x", "y"), ("z",)))
FC_OUT = Layout(((), ("x", "z"), ("y",)))
PROJ_OUT = Layout(((), ("x", "y"), ("z",)))


def _assignment(node: str, kind: str, scheme: str, strategy: str, inputs: list, outputs: list, params: dict,
                options: dict, block: str | None, cost: AssignmentCost, not_offered: list[str]) -> Assignment:
    return Assignment(node=node, target={"linear": "nn.Linear", "activation": "F.gelu",
                                         "embedding": "nn.Embedding"}[kind],
                      kind=kind, scheme=scheme, strategy=strategy, inputs=inputs, outputs=outputs,
                      params=params, options=options, block=block, module_path=node.replace("_", "."),
                      cost=cost, not_offered=not_offered)


def make_plan() -> Plan:
    """The example plan (a new object on every call)."""
    costs = {
        "wte": AssignmentCost(state_bytes=12_582_912, saved_bytes=4_096, transient_bytes=786_432,
                              compute_s=1.5e-05, comm_s=0.000125, comm_bytes=1_572_864, recompute_s=0.0),
        "h_0_fc": AssignmentCost(state_bytes=4_718_592, saved_bytes=393_216, transient_bytes=3_145_728,
                                 compute_s=0.000375, comm_s=0.00025, comm_bytes=5_505_024, recompute_s=0.0003125),
        "h_0_gelu": AssignmentCost(state_bytes=0, saved_bytes=0, transient_bytes=1_572_864,
                                   compute_s=2.5e-05, comm_s=0.0, comm_bytes=0, recompute_s=1.25e-05),
        "h_0_proj": AssignmentCost(state_bytes=4_718_592, saved_bytes=0, transient_bytes=2_359_296,
                                   compute_s=0.000375, comm_s=0.00025, comm_bytes=5_505_024, recompute_s=0.0003125),
    }
    vocab_out = Layout(((), ("x", "y"), ()))
    assignments = [
        _assignment("wte", "embedding", "vocab", "vocab[axes=z]", [Layout(((), ("x", "y")))], [vocab_out],
                    {"transformer.wte.weight": Layout((("z",), ()))}, {"axes": ["z"]}, None, costs["wte"],
                    ["3d: the vocabulary 50257 does not divide by 2", "2d: no 2D embedding strategy"]),
        _assignment("h_0_fc", "linear", "3d", "3d[roles=xyz,save_input=shard]", [FC_IN], [FC_OUT],
                    {"transformer.h.0.mlp.c_fc.weight": Layout((("y",), ("z", "x"))),
                     "transformer.h.0.mlp.c_fc.bias": Layout((("y",),))},
                    {"roles": ["x", "y", "z"], "save_input": "shard"}, "h.0", costs["h_0_fc"], []),
        _assignment("h_0_gelu", "activation", "follow", "follow", [FC_OUT], [FC_OUT], {}, {}, "h.0",
                    costs["h_0_gelu"], []),
        _assignment("h_0_proj", "linear", "3d", "3d[roles=xzy,save_input=gathered]", [FC_OUT], [PROJ_OUT],
                    {"transformer.h.0.mlp.c_proj.weight": Layout((("z",), ("y", "x"))),
                     "transformer.h.0.mlp.c_proj.bias": Layout((("z",),))},
                    {"roles": ["x", "z", "y"], "save_input": "gathered"}, "h.0", costs["h_0_proj"],
                    ["1d_row: the input arrives split on tokens"]),
    ]
    redistributions = [
        Redistribution(src="wte", dst="h_0_fc", shape=[8, 128, 768], src_layout=vocab_out, dst_layout=FC_IN,
                       steps=["slice(z) dim 2 [-, xy, -]->[-, xy, z]"], comm_bytes=0, seconds=0.0),
        Redistribution(src="h_0_proj", dst="output", shape=[8, 128, 768], src_layout=PROJ_OUT,
                       dst_layout=Layout(((), ("x", "y"), ())),
                       steps=["all_gather(z) dim 2 [-, xy, z]->[-, xy, -]"], comm_bytes=786_432, seconds=3.5e-05),
    ]
    ops = list(costs.items())
    per_op = [OpPrediction(node=n, scheme=a.scheme, time_s=c.compute_s + c.comm_s + c.recompute_s,
                           comm_bytes=c.comm_bytes, state_bytes=c.state_bytes, saved_bytes=c.saved_bytes)
              for (n, c), a in zip(ops, assignments)]
    states = 12_582_912 + 4_718_592 + 4_718_592        # = 22_020_096
    saved = 4_096 + 393_216                              # = 397_312 (the checkpointed block keeps fc's input)
    transient = 3_145_728                                # fc's gathered weight
    compute = 1.5e-05 + 0.000375 + 2.5e-05 + 0.000375
    comm = 0.000125 + 0.00025 + 0.0 + 0.00025 + 0.0 + 3.5e-05
    recompute = 0.0003125 + 1.25e-05 + 0.0003125
    # The step's peak (cost_models.memory.step_peak): at wte's backward every gradient exists (a quarter of
    # each op's 16 bytes per parameter) and only wte's 4,096 saved bytes are left, with its transient:
    # 22_020_096 + 4_096 + 786_432 = 22_810_624 (fc's backward: 22_020_096 - 3_145_728 + 397_312 + 3_145_728
    # = 22_417_408; the optimizer step: 22_020_096).
    peak = 22_810_624
    predicted = Predicted(
        peak_memory_bytes=peak, model_state_bytes=states, activation_bytes=saved,
        transient_bytes=transient, released_bytes=states + saved + transient - peak, step_time_s=compute + comm + recompute, compute_s=compute, comm_s=comm,
        comm_bytes=1_572_864 + 5_505_024 + 5_505_024 + 786_432, recompute_s=recompute, per_op=per_op)
    return Plan(
        model=ModelInfo(name="gpt-mlp-example", fingerprint="sha256:0123456789abcdef"),
        mesh=MESH, budget_bytes=64 * 2**20,
        hardware={"name": "a100-80gb", "gpus_per_node": 8, "peak_flops": 312e12, "memory_bandwidth": 2.039e12},
        assignments=assignments, redistributions=redistributions, checkpoint=["h.0"], predicted=predicted,
        solver=SolverInfo(name="highs", status="optimal", objective=compute + comm + recompute, gap=0.0,
                          seconds=0.125, method="flat"),
        options=PlanOptions(bytes_per_param=16, device="cuda", checkpointing=True,
                                           schemes=["replicate", "fsdp", "1d", "2d", "3d", "3d_allreduce"]),
    )
