"""layers3d: parallel layers on torch.distributed (replicate/FSDP, Megatron 1D, Optimus 2D, Bian's 3D and
the 3D all-reduce variant), the redistribution runtime and the collectives they share.

Every layer holds only this rank's shards, takes and returns this rank's blocks of activations in the
layouts of docs/ARCHITECTURE.md, and completes its parameter gradients in its own backward. A layer an
op family needs registers its builder beside it (`layers3d.builders`: `@builds(kind)`, fed plain data).
"""

from cost_models.linear_scheme import LinearPlan, LinearScheme
from layers3d.builders import LayerRequest, StoredPlacement, builder, builds
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
from layers3d.data_parallel import gather_param, reduce_grad
from layers3d.embedding import EMBEDDING_SCHEMES, ParallelEmbedding
from layers3d.errors import LayerBuildError, MeshSetupError, ShardingError
from layers3d.functional import GradReduce, OutputReduce, reduce_output, reduce_scatter_output
from layers3d.linear import ParallelLinear
from layers3d.loss import ParallelCrossEntropy, vocab_parallel_cross_entropy
from layers3d.mesh import DeviceMesh
from layers3d.norm import ParallelLayerNorm
from layers3d.redistribute import redistribute
from layers3d.rms_norm import ParallelRMSNorm
from layers3d.shard import default_init, gather_tensor, local_block, shard_generator, shard_tensor

__all__ = [
    "DeviceMesh", "MeshSetupError", "ShardingError", "LayerBuildError",
    "LayerRequest", "StoredPlacement", "builds", "builder", "GradReduce", "OutputReduce", "ParallelCrossEntropy",
    "CommCounter", "current_phase", "recompute_phase", "checkpoint", "checkpoint_contexts",
    "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast",
    "redistribute", "reduce_grad", "gather_param", "reduce_output", "reduce_scatter_output",
    "ParallelLinear", "LinearScheme", "LinearPlan",
    "ParallelLayerNorm", "ParallelRMSNorm", "ParallelEmbedding", "EMBEDDING_SCHEMES", "vocab_parallel_cross_entropy",
    "shard_tensor", "local_block", "gather_tensor", "shard_generator", "default_init",
]
