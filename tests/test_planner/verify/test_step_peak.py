"""The step's peak memory and the HF GPT-2 facts behind it, in exact bytes.

`cost_models.memory.step_peak` walks the backward op by op (gradients appear, saved activations are
freed); the captured HF GPT-2 tiny graph (tied wte/lm_head, an attention mask built from arange/cumsum,
checkpointed blocks that read both the hidden state and the mask) pins what the plan's accounting counts:
each number below was measured on 8 gloo ranks (planner.verify.measure, planner.verify.measure_memory; bench/fidelity.py).
"""

from __future__ import annotations

import pytest
from fidelity_cases import make_plans

from cost_models.hardware import load_profile
from cost_models.memory import grad_bytes_per_param, step_peak
from cost_models.mesh import Mesh
from cost_models.strategies import enumerate_strategies, mark_graph_hints, op_cost
from planner.models.loading import get_example
from planner.trace.graph import ModelGraph
from planner.trace.tracer import capture


def test_step_peak_walks_the_backward() -> None:
    # (state, saved, transient) per op in forward order; 16 bytes per parameter, 4 of them the gradient
    ops = [(1600, 100, 0), (0, 1000, 50), (3200, 10, 500)]
    sp = step_peak(ops, 16)
    # op 2's backward: the states less op 0's gradient (not computed yet), everything saved, op 2's
    # transient = 4800 - 400 + 1110 + 500 = 6010; op 1's: 4800 - 400 + 1100 + 50 = 5550 (op 2's saved
    # freed); op 0's: 4800 + 100 + 0 = 4900; the optimizer step: 4800
    assert (sp.peak, sp.at, sp.transient) == (6010, 2, 500)
    assert sp.released == 4800 + 1110 + 500 - 6010  # op 0's gradient, not yet computed
    assert step_peak([(1600, 0, 0)], 16).at is None  # nothing saved or transient: the optimizer step
    # what the optimizer step holds beside every state (nothing saved is alive by then)
    sp = step_peak(ops, 16, optimizer_bytes=2000)
    assert (sp.peak, sp.at, sp.transient, sp.released) == (4800 + 2000, None, 2000, 0)
    sp = step_peak(ops, 16, optimizer_bytes=1300)  # below the bound's backward term, above the backward's peak
    assert (sp.peak, sp.at, sp.released) == (4800 + 1300, None, 1110 + 500 - 1300)
    assert step_peak(ops, 16, optimizer_bytes=100) == step_peak(ops, 16)  # below the backward's peak
    assert step_peak([], 16).peak == 0
    assert grad_bytes_per_param("fp32_adam") == grad_bytes_per_param("bf16_mixed") == 4
    assert grad_bytes_per_param("inference") == 0


@pytest.fixture(scope="module")
def hf() -> ModelGraph:
    ex = get_example("hf-gpt2", device="cpu")
    graph = capture(ex.model, ex.example_inputs, name="hf-gpt2")
    mark_graph_hints(graph.nodes)
    return graph


def test_mask_ops_save_nothing(hf: ModelGraph) -> None:
    """The `where` that turns the bool mask into an additive bias carries no gradient: autograd records
    no node and saves no condition (the cost model said 4,096 B of bool mask)."""
    where = hf.node("where")
    assert where.attrs.get("no_grad") and where.attrs.get("saves") == (0,)
    mesh = Mesh((8,))
    hw = load_profile("cpu-gloo")
    found, _ = enumerate_strategies(where, mesh)
    assert all(op_cost(where, s, mesh, hw, device="cpu").saved == () for s in found)
    assert not hf.node("add_4").attrs.get("no_grad")  # the scores plus the mask do carry one


def test_tied_weight_is_state_once_and_its_copy_is_saved(hf: ModelGraph) -> None:
    plans = make_plans(hf, ["replicate", "1d"], (False, True))
    rep = plans[("replicate", False)]
    # 437,760 parameter elements on a replicated rank (the measured storages), not 470,528 (wte twice)
    assert rep.predicted.model_state_bytes == 437_760 * 16
    costs = {a.node: a.cost for a in rep.assignments}
    # the state sits at the head, the last user: the backward creates the gradient there
    assert costs["embedding"].state_bytes == 0 and costs["linear"].state_bytes == 256 * 128 * 16
    assert costs["where"].saved_bytes == 0
    one_d = {a.node: a.cost for a in plans[("1d", True)].assignments}
    # 1d: wte split on the hidden dim, the head on the vocabulary: the head saves its (32, 128) copy
    assert one_d["linear"].saved_bytes == 4 * 32 * 128 * 4 + 32 * 128 * 4


def test_checkpointed_blocks_keep_every_input_once(hf: ModelGraph) -> None:
    """Both blocks read the hidden state and the float mask (4, 1, 32, 32): a checkpointed block keeps
    both; the mask is one tensor for the two blocks. Measured on a 1d rank: 380,164 B saved in all
    (4 B more than predicted: the loss's scalar total weight)."""
    p = make_plans(hf, ["1d"], (True,))[("1d", True)]
    costs = {a.node: a.cost for a in p.assignments}
    assert costs["layer_norm"].saved_bytes == 4 * 4 * 128 * 4      # block 0's hidden state, token-split
    assert costs["add_4"].saved_bytes == 4 * 1 * 32 * 32 * 4        # the mask, kept by block 0
    assert costs["add_9"].saved_bytes == 0                          # ... and not again by block 1
    assert costs["layer_norm_2"].saved_bytes == 4 * 32 * 128 * 4   # block 1's hidden state, replicated
    assert p.predicted.activation_bytes == 380_160


def test_transposed_linear_backward_working_set(hf: ModelGraph) -> None:
    """HF's MLP projection (Conv1D: weight stored (in, out)) replicated: its backward holds dY
    (128 x 128), dX (128 x 512) and dW (512 x 128) computed transposed and copied into the gradient."""
    op = hf.node("addmm_3")
    mesh = Mesh((8,))
    found, _ = enumerate_strategies(op, mesh)
    rep = next(s for s in found if s.scheme == "replicate" and dict(s.options).get("dp") == ())
    cost = op_cost(op, rep, mesh, load_profile("cpu-gloo"), device="cpu")
    assert cost.transient_bytes == 128 * 128 * 4 + 128 * 512 * 4 + 512 * 128 * 4


def _cost(graph: ModelGraph, name: str, label: str, mesh: Mesh) -> int:
    op = graph.node(name)
    found, _ = enumerate_strategies(op, mesh)
    s = next(s for s in found if s.label() == label)
    return op_cost(op, s, mesh, load_profile("cpu-gloo"), device="cpu").transient_bytes


def test_row_parallel_output_reduction_and_split_backward(hf: ModelGraph) -> None:
    """A row-parallel projection's forward holds its partial output and the all-reduce's fresh copy
    (layers3d.comm.all_reduce clones): 2 x (128, 128) fp32. A split's backward holds the gradients of its
    parts (together the input's size) and their concatenation: 2 x (4, 32, 384) fp32."""
    mesh = Mesh((8,))
    assert _cost(hf, "addmm_1", "1d_row[T=x,dp=,sp=False]", mesh) == 2 * 128 * 128 * 4
    assert _cost(hf, "split", "follow", mesh) == 2 * 4 * 32 * 384 * 4


def test_recomputation_waits_with_the_gradient_at_the_block_end(hf: ModelGraph) -> None:
    """In a checkpointed block the backward of op i holds the recomputed activations of the block's ops up
    to i, its own working set, and the gradient that arrived at the block's last saving op (addmm_3's
    (128, 128) output on a replicated rank: 65,536 B), which waits through the recomputation. Measured
    replicate, checkpointed: 9,278,840 B peak against 9,344,256 predicted when the waiting gradient was
    counted twice at addmm_3 (it is its own output gradient there)."""
    plans = make_plans(hf, ["replicate"], (False, True))
    plain = plans[("replicate", False)].assignments
    ck = {a.node: a.cost for a in plans[("replicate", True)].assignments}
    upto = 0
    for a in plain:
        if a.block == "transformer.h.0":
            upto += a.cost.saved_bytes
        if a.node == "addmm_3":
            break
    own = plain[[a.node for a in plain].index("addmm_3")].cost.transient_bytes
    # dY, dX, the transposed dW's copy, and the residual stream's gradient waiting beside the MLP
    # (cost_models.grad_buffers: add_5's (4, 32, 128) fp32, read again by add_8 after the dropout)
    assert own == 128 * 128 * 4 + 128 * 512 * 4 + 512 * 128 * 4 + 4 * 32 * 128 * 4
    # the gradient waiting through the recomputation is addmm_3's own output gradient here (in `own`); the
    # block's input, which its first layer norm saves, is a kept input: the recomputation saves that same
    # storage again, nothing new ((4, 32, 128) fp32)
    kept = 4 * 32 * 128 * 4
    assert ck["addmm_3"].transient_bytes == own + upto - kept
