"""The cost model: what each op costs under each parallel scheme, and what layout conversions cost.

Pure description (no torch, no process groups): the mesh and layout vocabulary, hardware profiles,
alpha-beta collectives, roofline compute, memory presets, per-op strategies with their costs
(`enumerate_strategies`, `op_cost`) and redistribution costs on edges (`edge_cost`).
"""

from cost_models.comm import CommError, collective_seconds, ring_seconds
from cost_models.compute import matmul_flops, roofline_seconds
from cost_models.edges import EdgeCost, edge_cost
from cost_models.family import OpFamily, families, op_family, op_kinds
from cost_models.hardware import BUILTIN_PROFILES, HardwareProfile, ProfileError, load_profile
from cost_models.layout import Layout, LayoutError, split_tokens
from cost_models.memory import BYTES_PER_PARAM, MemoryModelError, peak_bytes, unique_saved_bytes
from cost_models.mesh import Mesh, MeshError, candidate_meshes
from cost_models.ops import DTYPE_BYTES, OpNode, ParamInfo, TensorMeta
from cost_models.redistribution import Step, backward_steps, plan_redistribution
from cost_models.strategies import (
    StrategyError,
    enumerate_strategies,
    mark_graph_hints,
    op_cost,
    op_signature,
)
from cost_models.strategy import HEAVY_SCHEMES, SCHEMES, Collective, OpCost, SavedTensor, Strategy

__all__ = [
    "CommError", "collective_seconds", "ring_seconds", "matmul_flops", "roofline_seconds", "EdgeCost", "edge_cost",
    "BUILTIN_PROFILES", "HardwareProfile", "ProfileError", "load_profile", "Layout", "LayoutError", "split_tokens",
    "BYTES_PER_PARAM", "MemoryModelError", "peak_bytes", "unique_saved_bytes", "Mesh", "MeshError",
    "candidate_meshes", "OpFamily", "families", "op_family", "op_kinds", "DTYPE_BYTES", "OpNode", "ParamInfo", "TensorMeta", "Step", "backward_steps",
    "plan_redistribution", "StrategyError", "enumerate_strategies", "mark_graph_hints", "op_cost", "op_signature",
    "HEAVY_SCHEMES", "SCHEMES", "Collective", "OpCost", "SavedTensor", "Strategy",
]
