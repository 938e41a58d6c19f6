"""`planner verify MODEL plan.json`: run the parallel model next to the dense one and compare.

Started on every rank by torchrun (`torchrun --standalone --nproc-per-node 8 -m planner verify ...`; gloo on
CPU, NCCL with one GPU per rank). Each rank builds the dense model from `--seed`, applies the plan, runs
one forward and backward of both on the same inputs and then `--steps` AdamW steps of both (the AdamW
implementation the plan was priced for: `options.optimizer`), and checks:

* numerics: the largest relative error of the outputs, the loss, every parameter gradient and (after the
  steps) every parameter and each step's loss, against `--tol`; gradients and parameters per tensor on
  the tensor's own scale with an absolute floor (`planner.verify.compare`), every failing tensor listed;
* communication: the bytes `layers3d.CommCounter` records in the first step, per collective kind and
  phase, against the bytes the plan's strategies predict (exactly);
* activations: the bytes autograd saves in the parallel forward (unique storages, per rank) against the
  plan's `activation_bytes`, within `--act-tol`;
* peak memory: the most bytes live tensor storages hold during one more AdamW training step of the
  parallel model (`planner.verify.measure_memory`), per rank, against the plan's `peak_memory_bytes`: fails when
  a rank needs more than 10% above it.

Rank 0 prints the report. The exit status is 0 when everything holds, 1 otherwise; a rank that raises or
dies makes every rank exit with 1 within seconds, printing the failing rank's message (`RankGuard`).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

__all__ = ["run_verify"]

EXIT_MISMATCH = 1


def _loss(out: Any) -> Any:
    """The scalar to differentiate: the model's loss (its first scalar output, or `loss` of a model
    output), else the mean square of its floating outputs."""
    import torch
    import torch.utils._pytree as pytree

    if isinstance(out, dict) and isinstance(out.get("loss"), torch.Tensor):
        return out["loss"]
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    for t in leaves:
        if t.dim() == 0:
            return t
    return sum((t.float() ** 2).mean() for t in leaves)


def _probe(model: Any, inputs: Any) -> Any:
    """The model's output, computed without a graph and without moving the random number generators."""
    import torch

    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        return _call(model, inputs)


def _returns_loss(out: Any) -> bool:
    """Whether the model's output holds a scalar (its loss), which `_loss` then differentiates."""
    return any(t.dim() == 0 for t in _float_leaves(out))


def _float_leaves(out: Any) -> list[Any]:
    import torch
    import torch.utils._pytree as pytree

    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _build(spec: str, seed: int) -> Any:
    import torch

    from planner.models.loading import EXAMPLES, get_example, load_model

    torch.manual_seed(seed)
    return get_example(spec, device="cpu", seed=seed) if spec in EXAMPLES else load_model(spec)


def _call(model: Any, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def _caller_block(value: Any, mode: str, mesh: Any, rank: int) -> Any:
    """What this rank passes or gets back for `value` under `apply_plan(inputs=mode)`: its block of the
    caller's layout (`caller_layout`, the layout apply_plan converts to and from), the value itself when
    that layout is whole (any value under "full", a scalar loss, a batch the ranks cannot share)."""
    import torch

    from cost_models.layout import caller_layout
    from layers3d.shard import shard_tensor

    if not isinstance(value, torch.Tensor):
        return value
    layout = caller_layout(tuple(value.shape), mode, mesh)
    return value if layout.is_replicated() else shard_tensor(value, layout, mesh, rank)


def _local_inputs(inputs: Any, mode: str, mesh: Any, rank: int) -> Any:
    """What this rank passes the parallel model: the whole inputs, or under a plan for inputs="sharded" its
    block of each batched input."""
    if isinstance(inputs, dict):
        return {k: _caller_block(v, mode, mesh, rank) for k, v in inputs.items()}
    return tuple(_caller_block(v, mode, mesh, rank) for v in inputs)


def _check_dropout(graph: Any, parallel: Any) -> int:
    """The number of dropout ops with p > 0 in training; refuses when one of them did not become a
    `ParallelDropout` (its masks would follow no rule)."""
    from planner.apply.values import ApplyError
    from planner.verify.dropout import live_dropouts

    live = [op.name for op in graph.nodes if op.kind == "dropout" and float(op.attrs.get("p", 0)) > 0
            and op.attrs.get("training", True)]
    if len(live) > len(live_dropouts(parallel)):
        raise ApplyError(f"the model applies dropout (p > 0) in {len(live)} op(s), e.g. {live[0]}, but only "
                         f"{len(live_dropouts(parallel))} run as ParallelDropout; build the model with dropout 0")
    return len(live)


def run_verify(spec: str, plan_path: str, *, steps: int = 0, tol: float = 1e-5, seed: int = 0,
               act_tol: float = 0.05, lr: float = 1e-4, adam_eps: float = 1e-6, out: Any = None,
               agree_timeout_s: float = 300.0, prepare: Any = None) -> int:
    """The per-rank body of `planner verify` inside an initialised process group; returns the exit status
    (the same on every rank). Rank 0 writes the report to `out` (default stdout). Before the first
    collective all ranks agree (`planner.apply.agree`) on the plan, the model, the inputs, the world size and
    the settings; ranks that differ are named on every rank. `prepare(parallel)`, when given, is called on
    the parallel model before anything runs (the tests break a model with it)."""
    import torch
    import torch.distributed as dist

    from cost_models.optimizer import optimizer_kwargs
    from layers3d.comm import CommCounter
    from layers3d.inflight import tracked
    from planner.apply.agree import agree, inputs_digest, model_digest, plan_digest
    from planner.apply.rewrite import apply_plan, check_inputs
    from planner.apply.state import gather_grads, gather_state_dict
    from planner.plans.format import Plan
    from planner.verify.compare import STEP_FLOOR, compare, grad_floor, move_floor, moved
    from planner.verify.measure import SavedActivationMeter, cuda_peak_memory
    from planner.verify.predict import by_kind, by_kind_equal, predicted_collectives
    from planner.verify.report import ErrorRow, VerifyReport, format_report, rel_error

    rank = dist.get_rank()
    plan = Plan.load(plan_path)
    example = _build(spec, seed)
    dense, inputs = example.model, example.example_inputs
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    dense = dense.to(device)
    inputs = {k: v.to(device) for k, v in inputs.items()} if isinstance(inputs, dict) \
        else tuple(v.to(device) for v in inputs)
    agree({"plan": plan_digest(plan), "model": model_digest(dense), "inputs": inputs_digest(inputs),
           "world size": str(dist.get_world_size()), "settings": f"model {spec}, seed {seed}, steps {steps}"},
          "the first collective of planner verify", timeout_s=agree_timeout_s)
    check_inputs(dense, plan, inputs)  # a plan for another model: the mismatch error naming both, not a capture error
    parallel = apply_plan(dense, plan, agree_timeout_s=agree_timeout_s)
    mode = plan.options.inputs  # a sharded plan: each rank passes and gets its block of the batch
    local = _local_inputs(inputs, mode, plan.mesh, rank)
    if mode == "sharded" and not _returns_loss(_probe(dense, inputs)):
        from planner.apply.values import ApplyError

        raise ApplyError(f"{spec} returns no scalar loss, so a plan for inputs='sharded' cannot be checked against "
                         "it (each rank would differentiate its own rows' outputs); verify a model that returns its "
                         "loss, or plan with inputs='full'")
    n_dropout = _check_dropout(parallel.source_graph, parallel)
    if prepare is not None:
        prepare(parallel)
    report = VerifyReport(example.name, plan_path, dist.get_world_size(), str(plan.mesh), tol, act_tol,
                          predicted_act=plan.predicted.activation_bytes)
    act_with_masks = None
    stack = contextlib.ExitStack()
    if n_dropout:  # masks checked with dropout on; saved activations measured with it (the plan prices masks)
        from planner.verify.dropout import dropout_off, mask_report

        report.dropout = (n_dropout, mask_report(parallel, lambda: _call(parallel, local)))
        with SavedActivationMeter.for_module(parallel) as meter:
            _loss(_call(parallel, local))
        act_with_masks = meter.bytes
        stack.enter_context(dropout_off(parallel))  # numerics: dropout off in both models

    # --- one step, measured --------------------------------------------------------------------------
    out_d = _call(dense, inputs)
    loss_d = _loss(out_d)
    loss_d.backward()
    with CommCounter() as counter, cuda_peak_memory(device if device.type == "cuda" else None) as peak:
        with SavedActivationMeter.for_module(parallel) as meter:
            out_p = _call(parallel, local)
            loss_p = _loss(out_p)
        loss_p.backward()
    report.errors.append(ErrorRow("loss", rel_error(loss_p, loss_d), f"dense {loss_d.item():.6f}"))
    pairs = list(zip(_float_leaves(out_p), [_caller_block(t, mode, plan.mesh, rank) for t in _float_leaves(out_d)]))
    report.errors.append(_worst("outputs", [(f"output {i}", rel_error(p, d)) for i, (p, d) in enumerate(pairs)]))
    dense_grads = {n: p.grad for n, p in dense.named_parameters() if p.grad is not None}
    report.errors.append(_row("gradients", compare(gather_grads(parallel), dense_grads, grad_floor(dense_grads)),
                              tol))
    planned = [c for c in counter.records if c.tag not in ("io", "tied")]
    report.measured_comm = by_kind(planned)
    for c in counter.records:
        if c.tag in ("io", "tied"):
            report.unplanned_comm[(c.kind, c.tag)] += c.bytes
    predicted = predicted_collectives(parallel.source_graph, plan)
    report.predicted_comm, report.plan_comm_total = by_kind(predicted.collectives), predicted.plan_total_bytes
    gathered: list[Any] = [None] * dist.get_world_size()
    act_bytes = meter.bytes if act_with_masks is None else act_with_masks
    with tracked("all_gather_object", (), "measured bytes and peaks"):
        dist.all_gather_object(gathered, (act_bytes, dict(report.measured_comm),
                                          peak.get("peak", 0) - peak.get("start", 0)))
    report.measured_act = [int(b) for b, _, _ in gathered]
    report.comm_off_ranks = [r for r, (_, comm, _) in enumerate(gathered)
                             if not by_kind_equal(comm, report.predicted_comm)]
    if peak:
        report.step_peak = [int(p) for _, _, p in gathered]
        report.predicted_step_peak = plan.predicted.bound_bytes - plan.predicted.model_state_bytes

    # --- training steps ------------------------------------------------------------------------------
    adamw = optimizer_kwargs(plan.options.optimizer)  # the AdamW implementation whose step the plan priced
    if steps > 0:
        before = {k: v.detach().clone() for k, v in dense.state_dict().items() if v.is_floating_point()}
        opt_d = torch.optim.AdamW(dense.parameters(), lr=lr, eps=adam_eps, **adamw)
        opt_p = torch.optim.AdamW(parallel.parameters(), lr=lr, eps=adam_eps, **adamw)
        for k in range(steps):
            if k > 0:
                for model in (dense, parallel):
                    model.zero_grad(set_to_none=True)
                loss_d = _loss(_call(dense, inputs))
                loss_d.backward()
                loss_p = _loss(_call(parallel, local))
                loss_p.backward()
            opt_d.step()
            opt_p.step()
            with torch.no_grad():
                after_d, after_p = _loss(_call(dense, inputs)).item(), _loss(_call(parallel, local)).item()
            report.step_losses.append((after_d, after_p))
        state = gather_state_dict(parallel)
        after = {k: v for k, v in dense.state_dict().items() if k in before}
        report.errors.append(_row(f"parameters after {steps} steps",
                                  compare(state, after, move_floor(moved(after, before), STEP_FLOOR)), tol))
    stack.close()  # dropout back on: the peak below includes the masks the plan prices
    # --- peak memory of one training step (planner.verify.measure_memory), last: it moves the parameters -----
    from planner.verify.measure_memory import step_peak_bytes

    parallel.zero_grad(set_to_none=True)
    peak_p = step_peak_bytes(parallel, lambda: _loss(_call(parallel, local)),
                             torch.optim.AdamW(parallel.parameters(), lr=lr, eps=adam_eps, **adamw))
    where = f"in the {peak_p['peak_phase']}, after {peak_p['peak_op']}" if peak_p["peak_op"] else ""
    peaks: list = [None] * dist.get_world_size()
    with tracked("all_gather_object", (), "measured peak memory"):
        dist.all_gather_object(peaks, (int(peak_p["peak"]), where))
    report.measured_peak, report.peak_at = [p for p, _ in peaks], [w for _, w in peaks]
    report.predicted_peak = plan.predicted.peak_memory_bytes
    if rank == 0:
        print(format_report(report), file=out or sys.stdout, flush=True)
    with tracked("barrier", (), "end of planner verify"):
        dist.barrier()
    return 0 if report.ok else EXIT_MISMATCH


def _worst(what: str, rows: list[tuple[str, float]]) -> Any:
    from planner.verify.report import ErrorRow

    if not rows:
        return ErrorRow(what, 0.0, "(none)", 0)
    name, err = max(rows, key=lambda r: r[1])
    return ErrorRow(what, err, name, len(rows))


def _row(what: str, c: Any, tol: float) -> Any:
    """An ErrorRow from a `planner.verify.compare.Comparison`: the worst tensor and every failing one."""
    from planner.verify.report import ErrorRow

    if c.worst is None:
        return ErrorRow(what, 0.0, "(none)", 0)
    return ErrorRow(what, c.error, c.worst.name, len(c.rows), [(r.name, r.error) for r in c.failing(tol)])
