"""Which ops' outputs share their input's storage: views and identities, so a saved view counts its base.

Autograd keeps a saved tensor's whole storage alive: a linear that saves `x[:, 0]` keeps all of `x`, and
a linear that saves `relu(h).flatten(1)` keeps the storage relu saved already. The runtime's views are:

* identities: an identity dropout (p = 0 or not training), a cast to the dtype it already has, `alias`,
  and `contiguous` of a tensor that is contiguous already;
* permute / transpose;
* indexing with slices and ints (select, slice; `x[:, 0]`);
* a reshape (view / flatten / unflatten / squeeze / unsqueeze) that torch can view with its input's
  strides; otherwise it copies. The strides are the run-time ones (`cost_models.strides.runtime_strides`,
  the rule the SDPA output hint uses too): an expand that broadcasts has stride-0 dims, so repeat_kv's
  reshape of it copies (SDPA's rule prices those copies; measured on HF Qwen2 under 3d_allreduce), and
  CPU attention writes its output in q's memory order.

Only when the view op reads its input in the layout its producer makes it (no conversion on the edge).
Measured: torch-cnn replicate, fc saving `flatten(relu_1)` kept no bytes beyond relu's saved output
(65,536 B predicted twice before); HF ViT's classifier saving `x[:, 0]` keeps the whole (8, 17, 64) output
of the last layer norm (34,816 B, not the 2,048 B of the view).
"""

from __future__ import annotations

from planner.search.build import BuiltProblem
from planner.search.price_nodes import views_as_it_flows
from planner.trace.graph import ModelGraph

__all__ = ["storage_bases"]


def storage_bases(graph: ModelGraph, built: BuiltProblem, pick: dict[str, int], device: str) -> dict[str, str]:
    """Op name -> the op whose output storage its output views (see the module docstring), for the ops
    whose output is a view or an identity of another op's single output; other ops are absent. `device`:
    the device kind the plan runs on (attention's output order depends on it)."""
    base: dict[str, str] = {}
    nodes = {n.name: n for n in graph.nodes}
    memo: dict[str, tuple[int, ...] | None] = {}
    for op in graph.nodes:
        if not op.inputs or op.inputs[0] not in nodes:
            continue
        src = op.inputs[0]
        if views_as_it_flows(op, nodes[src], built.strategies[op.name][pick[op.name]], built.strategies[src][pick[src]],
                             nodes, device, memo):
            base[op.name] = base.get(src, src)
    return base
