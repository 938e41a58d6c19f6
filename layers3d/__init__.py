"""layers3d: parallel layers on torch.distributed (replicate/FSDP, Megatron 1D, Optimus 2D, Bian's 3D and
the 3D all-reduce variant), the redistribution runtime and the collectives they share."""

from layers3d.checkpoint import checkpoint, checkpoint_contexts
from layers3d.comm import (
    CommCounter,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    current_phase,
    recompute_phase,
    reduce_scatter,
)
from layers3d.errors import MeshSetupError, ShardingError
from layers3d.linear import ParallelLinear
from layers3d.linear_plan import LINEAR_SCHEMES, LinearGeometry, LinearScheme
from layers3d.mesh import DeviceMesh
from layers3d.redistribute import redistribute
from layers3d.shard import gather_tensor, local_block, shard_generator, shard_tensor

__all__ = [
    "DeviceMesh", "MeshSetupError", "ShardingError", "CommCounter", "current_phase", "recompute_phase",
    "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "redistribute", "checkpoint",
    "checkpoint_contexts", "shard_tensor", "ParallelLinear", "LinearScheme", "LinearGeometry", "LINEAR_SCHEMES",
    "local_block", "gather_tensor", "shard_generator",
]
