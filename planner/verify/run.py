"""`planner verify MODEL plan.json`: run the parallel model next to the dense one and compare.

Started on every rank by torchrun (`torchrun --standalone --nproc-per-node 8 -m planner verify ...`; gloo on
CPU, NCCL with one GPU per rank). Each rank builds the dense model from `--seed`, applies the plan, runs
one forward and backward of both on the same inputs and then `--steps` AdamW steps of both, and checks:

* numerics: the largest relative error of the outputs, the loss, every parameter gradient and (after the
  steps) every parameter and each step's loss, against `--tol`;
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

import argparse
import sys
from typing import Any

from planner.cli.registry import CliError, arg, command

__all__ = ["verify_command", "run_verify", "main"]

EXIT_MISMATCH = 1
BACKEND_GRACE_S = 30.0  # the process group's timeout is --timeout plus this


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


def _check_dropout(graph: Any) -> None:
    from planner.apply.values import ApplyError

    live = [op.name for op in graph.nodes if op.kind == "dropout" and float(op.attrs.get("p", 0)) > 0
            and op.attrs.get("training", True)]
    if live:
        raise ApplyError(f"the model applies dropout (p > 0) in {len(live)} op(s), e.g. {live[0]}: its random masks "
                         "differ between the dense and the parallel run, so they cannot be compared; build the model "
                         "with dropout 0 (e.g. a factory that sets it) and plan it again")


def run_verify(spec: str, plan_path: str, *, steps: int = 0, tol: float = 1e-5, seed: int = 0,
               act_tol: float = 0.05, lr: float = 1e-4, adam_eps: float = 1e-6, out: Any = None,
               agree_timeout_s: float = 300.0) -> int:
    """The per-rank body of `planner verify` inside an initialised process group; returns the exit status
    (the same on every rank). Rank 0 writes the report to `out` (default stdout). Before the first
    collective all ranks agree (`planner.apply.agree`) on the plan, the model, the inputs, the world size and
    the settings; ranks that differ are named on every rank."""
    import torch
    import torch.distributed as dist

    from layers3d.comm import CommCounter
    from layers3d.inflight import tracked
    from planner.apply.agree import agree, inputs_digest, model_digest, plan_digest
    from planner.apply.rewrite import apply_plan, check_inputs
    from planner.apply.state import gather_grads, gather_state_dict
    from planner.plans.format import Plan
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
    _check_dropout(parallel.source_graph)
    report = VerifyReport(example.name, plan_path, dist.get_world_size(), str(plan.mesh), tol, act_tol,
                          predicted_act=plan.predicted.activation_bytes)

    # --- one step, measured --------------------------------------------------------------------------
    out_d = _call(dense, inputs)
    loss_d = _loss(out_d)
    loss_d.backward()
    with CommCounter() as counter, cuda_peak_memory(device if device.type == "cuda" else None) as peak:
        with SavedActivationMeter.for_module(parallel) as meter:
            out_p = _call(parallel, inputs)
            loss_p = _loss(out_p)
        loss_p.backward()
    report.errors.append(ErrorRow("loss", rel_error(loss_p, loss_d), f"dense {loss_d.item():.6f}"))
    pairs = list(zip(_float_leaves(out_p), _float_leaves(out_d)))
    report.errors.append(_worst("outputs", [(f"output {i}", rel_error(p, d)) for i, (p, d) in enumerate(pairs)]))
    grads = gather_grads(parallel)
    dense_params = dict(dense.named_parameters())
    report.errors.append(_worst("gradients", [(n, rel_error(g, dense_params[n].grad)) for n, g in grads.items()
                                              if dense_params[n].grad is not None]))
    planned = [c for c in counter.records if c.tag not in ("io", "tied")]
    report.measured_comm = by_kind(planned)
    for c in counter.records:
        if c.tag in ("io", "tied"):
            report.unplanned_comm[(c.kind, c.tag)] += c.bytes
    predicted = predicted_collectives(parallel.source_graph, plan)
    report.predicted_comm, report.plan_comm_total = by_kind(predicted.collectives), predicted.plan_total_bytes
    gathered: list[Any] = [None] * dist.get_world_size()
    with tracked("all_gather_object", (), "measured bytes and peaks"):
        dist.all_gather_object(gathered, (meter.bytes, dict(report.measured_comm),
                                          peak.get("peak", 0) - peak.get("start", 0)))
    report.measured_act = [int(b) for b, _, _ in gathered]
    report.comm_off_ranks = [r for r, (_, comm, _) in enumerate(gathered)
                             if not by_kind_equal(comm, report.predicted_comm)]
    if peak:
        report.step_peak = [int(p) for _, _, p in gathered]
        report.predicted_step_peak = plan.predicted.activation_bytes + plan.predicted.transient_bytes

    # --- training steps ------------------------------------------------------------------------------
    if steps > 0:
        opt_d = torch.optim.AdamW(dense.parameters(), lr=lr, eps=adam_eps)
        opt_p = torch.optim.AdamW(parallel.parameters(), lr=lr, eps=adam_eps)
        for k in range(steps):
            if k > 0:
                for model in (dense, parallel):
                    model.zero_grad(set_to_none=True)
                loss_d = _loss(_call(dense, inputs))
                loss_d.backward()
                loss_p = _loss(_call(parallel, inputs))
                loss_p.backward()
            opt_d.step()
            opt_p.step()
            with torch.no_grad():
                after_d, after_p = _loss(_call(dense, inputs)).item(), _loss(_call(parallel, inputs)).item()
            report.step_losses.append((after_d, after_p))
        state = gather_state_dict(parallel)
        ref = dense.state_dict()
        floats = {k: v for k, v in state.items() if ref[k].is_floating_point()}
        floor = max((ref[k].abs().max().item() for k in floats if ref[k].numel()), default=0.0)
        report.errors.append(_worst(f"parameters after {steps} steps", [
            (k, rel_error(v, ref[k], floor)) for k, v in floats.items()]))
    # --- peak memory of one training step (planner.verify.measure_memory), last: it moves the parameters -----
    from planner.verify.measure_memory import step_peak_bytes

    parallel.zero_grad(set_to_none=True)
    peak_p = step_peak_bytes(parallel, lambda: _loss(_call(parallel, inputs)),
                             torch.optim.AdamW(parallel.parameters(), lr=lr, eps=adam_eps))["peak"]
    report.measured_peak, report.predicted_peak = [None] * dist.get_world_size(), plan.predicted.peak_memory_bytes
    with tracked("all_gather_object", (), "measured peak memory"):
        dist.all_gather_object(report.measured_peak, int(peak_p))
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


@command("verify", "run the parallel model next to the dense one under torchrun and compare",
         args=[arg("model", metavar="MODEL", help="built-in example name, path/to/file.py:factory or "
                                                  "package.module:factory (the model the plan was made for)"),
               arg("plan_file", metavar="PLAN", help="plan JSON written by `planner plan`"),
               arg("--steps", type=int, default=0, help="AdamW steps to run after the first comparison"),
               arg("--tol", type=float, default=1e-5, help="largest relative error allowed (default 1e-5)"),
               arg("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)"),
               arg("--act-tol", type=float, default=0.05,
                   help="allowed relative difference of measured and predicted activation bytes (default 0.05)"),
               arg("--lr", type=float, default=1e-4, help="AdamW learning rate for --steps (default 1e-4)"),
               arg("--adam-eps", type=float, default=1e-6,
                   help="AdamW epsilon (default 1e-6: with torch's 1e-8, parameters whose gradient is zero in "
                        "exact arithmetic, such as the attention key bias, move by rounding noise, which no two "
                        "summation orders reproduce)"),
               arg("--timeout", type=float, default=300.0,
                   help="seconds a collective (or the ranks' start-up agreement) may wait before the run stops, "
                        "naming the collective and the ranks missing from it (default 300)")],
         description="Run under `torchrun --standalone --nproc-per-node N -m planner verify MODEL plan.json`: "
                     "builds the dense and the parallel model from the same seed, compares outputs, loss, "
                     "gradients (and --steps AdamW steps), and measured against predicted communication and "
                     "activation bytes. Exits 1 when anything is off; a failing rank stops every rank.")
def verify_command(args: argparse.Namespace) -> int:
    from planner.verify.guard import RankGuard, init_distributed

    if args.steps < 0 or args.tol <= 0 or args.act_tol < 0:
        raise CliError("--steps must be >= 0, --tol > 0 and --act-tol >= 0")
    if not args.timeout > 0:
        raise CliError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    # The backend's own timeout comes later than the guard's deadline, so that the guard, which can name
    # the collective and the missing peers, is the one that stops a stuck run.
    ctx = init_distributed(timeout_s=args.timeout + BACKEND_GRACE_S)
    with RankGuard(ctx.guard_store, ctx.rank, ctx.world_size, debug=getattr(args, "debug", False),
                   deadline_s=args.timeout):
        status = run_verify(args.model, args.plan_file, steps=args.steps, tol=args.tol, seed=args.seed,
                            act_tol=args.act_tol, lr=args.lr, adam_eps=args.adam_eps, agree_timeout_s=args.timeout)
    _shutdown()
    return status


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """`python -m planner.verify.run MODEL plan.json ...` (the same as `planner verify`)."""
    from planner.cli.app import main as cli_main

    return cli_main(["verify", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
