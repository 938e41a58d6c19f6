"""Ops without a rule of their own that hold parameters or buffers ("opaque"): counted in full, planned with
replicate / fsdp, and checked buildable before a plan leaves `plan()`.

* A 6.3 M-parameter LSTM language model: its states are counted (a 2 MiB budget is refused, with the
  smallest budget that fits), replicate counts exactly 16 bytes per parameter, fsdp at least 16/8.
* `out, (h, c) = lstm(x)`: the LSTM has one layout per output and the getitems read its flat outputs.
* Conv2d + BatchNorm2d: the running statistics are state; BatchNorm keeps its batch whole and says why.
* The opaque rule's fsdp collectives, exactly.
* `check_applicable` refuses a plan edited into one the runtime cannot build, naming the op; a reduction
  the runtime cannot all-reduce (amax) is not offered over split dims.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cost_models.hardware import load_profile
from cost_models.layout import Layout
from cost_models.mesh import Mesh
from cost_models.strategies import enumerate_strategies, op_cost
from planner.api import InfeasibleError, plan
from planner.apply.applicable import NotApplicableError, check_applicable
from planner.trace.tracer import capture

VOCAB, HIDDEN = 1000, 512


class LSTMLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, hidden: int = HIDDEN, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out, (h, c) = self.lstm(self.emb(ids))
        return F.cross_entropy(self.head(out).flatten(0, 1), targets.flatten())


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.fc(torch.relu(self.bn(self.conv(x))).flatten(1)), y)


def _lstm() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (8, 16))
    return LSTMLM(hidden=768), (ids, ids.clone())


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_lstm_states_are_counted() -> None:
    model, inputs = _lstm()
    n = _params(model)
    assert n > 6_300_000
    with pytest.raises(InfeasibleError) as e:  # main planned this at 2 MiB, predicting 256 KiB
        plan(model, "2MiB", world_size=8, example_inputs=inputs, meshes=[Mesh((8,))])
    assert e.value.min_budget_bytes > 16 * n // 8
    rep = plan(model, "1GiB", world_size=8, example_inputs=inputs, schemes=["replicate"], meshes=[Mesh((8,))])
    assert rep.predicted.model_state_bytes == 16 * n
    tight = plan(model, e.value.min_budget_bytes, world_size=8, example_inputs=inputs, meshes=[Mesh((8,))])
    assert tight.feasible and tight.predicted.model_state_bytes >= 16 * n // 8
    lstm = next(a for a in tight.assignments if a.kind == "opaque")
    assert lstm.scheme == "fsdp" and len(lstm.outputs) == 3 and len(lstm.params) == 8


def test_lstm_outputs_have_one_layout_each() -> None:
    model, inputs = _lstm()
    g = capture(model, inputs)
    lstm = next(n for n in g.nodes if n.kind == "opaque")
    assert [o.shape for o in lstm.outputs] == [(8, 16, 768), (2, 8, 768), (2, 8, 768)]
    assert lstm.attrs["batch_dims"] == (0,) and lstm.attrs["out_batch_dims"] == (0, 1, 1)
    picks = sorted(n.attrs["index"] for n in g.nodes if n.kind == "getitem" and n.inputs == [lstm.name])
    assert picks == [0, 1, 2]  # out, h, c: flat outputs of the nested (out, (h, c))
    assert lstm.attrs["saved_source"] == "estimated" and lstm.attrs["saved_bytes"] > 0


def test_batch_norm_buffers_and_whole_batch() -> None:
    torch.manual_seed(0)
    model, x, y = ConvBN(), torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))
    p = plan(model, "1GiB", world_size=8, example_inputs=(x, y), schemes=["replicate"], meshes=[Mesh((8,))])
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert buffers == 16 * 4 * 2 + 8  # running mean and var (fp32), num_batches_tracked (int64)
    assert p.predicted.model_state_bytes == 16 * _params(model) + buffers
    bn = next(a for a in p.assignments if a.node == "bn")
    assert bn.kind == "opaque" and all(lay.is_replicated() for lay in bn.inputs)
    assert any("batch statistics" in r for r in bn.not_offered)
    assert model.bn.num_batches_tracked.item() == 0  # capture did not run the real module


def _op_of(model: nn.Module, inputs: tuple, name: str):
    g = capture(model, inputs)
    return next(n for n in g.nodes if n.name == name)


def test_fsdp_collectives_exact() -> None:
    torch.manual_seed(0)
    model, x, y = ConvBN(), torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))
    conv = _op_of(model, (x, y), "conv")
    mesh = Mesh((2, 4), ("x", "y"))
    found, _ = enumerate_strategies(conv, mesh)
    s = next(s for s in found if s.scheme == "fsdp" and s.option("dp") == ("x",))
    weight = 16 * 3 * 3 * 3 * 4
    assert dict(s.params)["weight"] == Layout.shard(4, 0, ("x", "y"))
    cost = op_cost(conv, s, mesh, load_profile("a100-80gb"))
    assert cost.param_elems == 16 * 3 * 3 * 3 // 8
    got = sorted((c.kind, c.axes, c.bytes, c.phase) for c in cost.collectives)
    assert got == sorted([("all_gather", ("y",), weight // 2, "forward"), ("all_gather", ("x",), weight, "forward"),
                          ("reduce_scatter", ("x",), weight, "backward")])
    assert s.inputs[0] == Layout.shard(4, 0, ("x",)) and s.outputs[0] == Layout.shard(4, 0, ("x",))


def test_check_applicable_refuses_what_the_runtime_refuses() -> None:
    torch.manual_seed(0)
    model, inputs = LSTMLM(vocab=64, hidden=32), (torch.randint(0, 64, (8, 4)),) * 2
    p = plan(model, "1GiB", world_size=8, example_inputs=inputs, meshes=[Mesh((8,))])  # checked inside plan()
    g = capture(model, inputs)
    check_applicable(model, g, p)
    emb = next(i for i, a in enumerate(p.assignments) if a.kind == "embedding")
    bad = dataclasses.replace(p, assignments=list(p.assignments))
    bad.assignments[emb] = dataclasses.replace(p.assignments[emb], scheme="2d", strategy="2d")
    with pytest.raises(NotApplicableError, match=r"op emb \(nn.Embedding, 2d\).*not one the runtime implements"):
        check_applicable(model, g, bad)


class _Amax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x).amax(dim=-1).sum()


def test_amax_needs_its_dim_whole() -> None:
    p = plan(_Amax(), "1GiB", world_size=8, example_inputs=(torch.randn(16, 64),), schemes=["1d"])
    amax = next(a for a in p.assignments if a.node == "amax")
    assert not amax.inputs[0].dims[-1]  # main planned the split dim, then apply_plan refused it


# --- run whole on 8 gloo ranks: Conv1d (its whole-op strategies), GroupNorm and a leaf nn.MultiheadAttention
# split over the batch ---------------------------------------------------------------------------------------
class Mixer(nn.Module):
    """Conv1d over time, GroupNorm, self-attention (torch's fused in-projection, traced as a leaf), head."""

    def __init__(self, dim: int = 16, classes: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)
        self.norm = nn.GroupNorm(4, dim)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.conv(x.transpose(1, 2))).transpose(1, 2)   # (B, T, D)
        h, _ = self.attn(h, h, h, need_weights=False)
        return F.cross_entropy(self.head(h.mean(dim=1)), y)


def _mixer() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return Mixer(), (torch.randn(8, 6, 16), torch.randint(0, 8, (8,)))


def _mixer_rank(rank: int, plans: dict[str, object]) -> dict[str, float]:
    from apply_checks import device_mesh

    from planner.apply.rewrite import apply_plan
    from planner.apply.state import gather_grads

    model, inputs = _mixer()
    model(*inputs).backward()
    out = {}
    for name, p in plans.items():
        dense, inputs = _mixer()
        parallel = apply_plan(dense, p, mesh=device_mesh(p.mesh))
        loss = parallel(*inputs)
        loss.backward()
        grads = gather_grads(parallel)
        out[name] = max((grads[n] - q.grad).abs().max().item() / q.grad.abs().max().item()
                        for n, q in model.named_parameters())
        out[name + ":loss"] = abs(loss.item() - model(*inputs).item())
    return out


@pytest.mark.distributed
def test_conv1d_groupnorm_attention_split_over_the_batch() -> None:
    from apply_plans import mixed_plan
    from distributed import run_ranks

    model, inputs = _mixer()
    g = capture(model, inputs)
    kinds = {n.name: n.kind for n in g.nodes if n.params}
    assert kinds == {"conv": "conv", "norm": "opaque", "attn": "opaque", "head": "linear"}
    plans = {}
    for scheme in ("replicate", "fsdp"):  # the three run on batch blocks (dp = x): picked by rule
        def rule(name: str, path: str, kind: str, s, scheme: str = scheme) -> bool:
            return kind not in ("opaque", "conv") or (s.scheme == scheme and s.option("dp") == ("x",))
        plans[scheme] = mixed_plan(g, checkpoint=(), rule=rule, mesh=Mesh((8,)))
        check_applicable(model, g, plans[scheme])
        by = {a.node: a for a in plans[scheme].assignments}
        assert all(by[n].inputs[0] == Layout.shard(3, 0, ("x",)) for n in ("conv", "norm", "attn"))
    errs = run_ranks(_mixer_rank, 8, timeout_s=300, args=(plans,))[0]
    assert max(errs.values()) <= 1e-5, errs


def test_lstm_saved_bytes_match_the_cpu_kernel() -> None:
    """What an nn.LSTM saves is estimated from runs of one and two samples on CPU, extrapolated to the
    batch (the meta decomposition saves about half of what the CPU kernel keeps)."""
    torch.manual_seed(0)
    model, ids = LSTMLM(vocab=64, hidden=64), torch.randint(0, 64, (8, 16))
    lstm = next(n for n in capture(model, (ids, ids)).nodes if n.kind == "opaque")
    x = model.emb(ids).detach().requires_grad_(True)
    own = {p.untyped_storage().data_ptr() for p in model.lstm.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.lstm(x)
    measured = sum(b for ptr, b in seen.items() if ptr not in own)
    assert lstm.attrs["saved_source"] == "estimated" and lstm.attrs["saved_inputs"] == ()
    assert abs(lstm.attrs["saved_bytes"] - measured) <= 0.02 * measured, (lstm.attrs["saved_bytes"], measured)


class _Scaled(nn.Module):
    """T5LayerNorm's last step: a parameter times an activation (the element-wise rule prices no parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(16))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scale * torch.tanh(x)).sum()


def test_parameter_times_activation_saves_what_the_element_wise_rule_says() -> None:
    """`scale * x` keeps x for the scale's gradient (the scale itself is state) and not its output."""
    g = capture(_Scaled(), (torch.randn(8, 16),))
    mul = next(n for n in g.nodes if n.kind == "opaque")
    assert mul.attrs["saved_source"] == "rule" and mul.attrs["saved_inputs"] == (0,)
    assert mul.attrs["saved_bytes"] == 0 and mul.attrs["batch_dims"] == (0,)
