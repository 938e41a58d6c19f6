"""A 2-layer MLP and a small GPT (embedding, one transformer block with attention heads split over the
feature axes, final layer norm, vocabulary head, cross-entropy) built from layers3d layers train 3 AdamW
steps on 8 gloo ranks with the same losses and final weights as the dense model (fp32, <= 1e-5), for
every scheme, sequence parallelism, checkpointing and a mix of schemes joined by redistribution."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cost_models.layout import Layout
from cost_models.mesh import Mesh
from tests.distributed import run_ranks
from tests.layers3d_helpers import rel_err

pytestmark = pytest.mark.distributed

B, S, H, HEADS, V = 4, 4, 16, 8, 32


class Block(nn.Module):
    """nanoGPT's block without dropout: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.c_attn, self.c_proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.c_fc, self.mlp_proj = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.c_proj(attention(self.c_attn(self.ln_1(x)), HEADS))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.block, self.ln_f = nn.Embedding(V, H), Block(), nn.LayerNorm(H)
        self.head = nn.Linear(H, V, bias=False)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.ln_f(self.block(self.wte(ids))))
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def attention(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    """Causal self-attention on (b, s, 3h) -> (b, s, h) with `heads` heads: plain torch ops, so it runs
    unchanged on a rank's block of heads (the sequence must be whole)."""
    b, s, h3 = qkv.shape
    q, k, v = qkv.split(h3 // 3, dim=-1)
    q, k, v = (t.reshape(b, s, heads, -1).transpose(1, 2) for t in (q, k, v))   # (b, nh, s, hd)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    att = att.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(b, s, h3 // 3)


# name -> (embedding (scheme, axes, dp, sp), {linear name: (scheme, roles, dp, options)}); None dp: the rest
PLANS: dict[str, tuple] = {
    "1d": (("vocab", ("y", "z"), None, False), {n: (s, ("y", "z"), None, {}) for n, s in (
        ("c_attn", "1d_col"), ("c_proj", "1d_row"), ("c_fc", "1d_col"), ("mlp_proj", "1d_row"), ("head", "1d_col"))}),
    "1d_sp": (("vocab", ("y", "z"), None, True), {n: (s, ("y", "z"), None, {"sp": True}) for n, s in (
        ("c_attn", "1d_col"), ("c_proj", "1d_row"), ("c_fc", "1d_col"), ("mlp_proj", "1d_row"), ("head", "1d_col"))}),
    "2d": (("hidden", ("z",), None, False), {n: ("2d", ("y", "z"), None, {}) for n in (
        "c_attn", "c_proj", "c_fc", "mlp_proj", "head")}),
    "3d": (("hidden", ("z",), None, False), {
        "c_attn": ("3d", ("x", "y", "z"), None, {}), "c_proj": ("3d", ("x", "z", "y"), None, {}),
        "c_fc": ("3d", ("x", "y", "z"), None, {"save_input": "shard"}), "mlp_proj": ("3d", ("x", "z", "y"), None, {}),
        "head": ("3d", ("x", "y", "z"), None, {})}),
    "3d_allreduce": (("hidden", ("y",), ("x",), False), {
        "c_attn": ("3d_allreduce", ("x", "y", "z"), None, {}), "c_proj": ("3d_allreduce", ("x", "z", "y"), None, {}),
        "c_fc": ("3d_allreduce", ("x", "y", "z"), None, {"weight_shard": True}),
        "mlp_proj": ("3d_allreduce", ("x", "z", "y"), None, {}), "head": ("3d_allreduce", ("x", "y", "z"), None, {})}),
    # fsdp over x, y (z holds replicas): B tokens split 4 ways stay on the batch dim, as attention needs
    "fsdp": (("fsdp", (), ("x", "y"), False), {n: ("fsdp", (), ("x", "y"), {}) for n in (
        "c_attn", "c_proj", "c_fc", "mlp_proj", "head")}),
    "mixed": (("hidden", ("z",), None, False), {  # 1d attention over all 8 ranks, 3d MLP, replicated head
        "c_attn": ("1d_col", ("x", "y", "z"), None, {}), "c_proj": ("1d_row", ("x", "y", "z"), None, {}),
        "c_fc": ("3d", ("x", "y", "z"), None, {}), "mlp_proj": ("3d", ("x", "z", "y"), None, {}),
        "head": ("replicate", (), None, {})}),
}


def _axes(layout: Layout, dims: slice) -> tuple[str, ...]:
    return tuple(a for d in layout.dims[dims] for a in d)


class ParallelGPT(nn.Module):
    """GPT from layers3d layers; `redistribute` joins layers whose layouts differ (the residual stream
    keeps the embedding's output layout)."""

    def __init__(self, dense: GPT, dm, plan: tuple, ckpt: bool) -> None:  # noqa: ANN001
        from cost_models.linear_scheme import LinearScheme
        from layers3d import ParallelEmbedding, ParallelLayerNorm, ParallelLinear

        super().__init__()
        (e_scheme, e_axes, e_dp, e_sp), linears = plan
        self.dm, self.ckpt = dm, ckpt
        self.wte = ParallelEmbedding.from_dense(dense.wte, dm, e_scheme, axes=e_axes, dp=e_dp, sp=e_sp)
        self.res = self.wte.output_layout((B, S, H))
        feat, tok = self.res.dims[-1], _axes(self.res, slice(0, -1))
        self.lns = nn.ModuleDict({n: ParallelLayerNorm.from_dense(m, dm, features=feat, tokens=tok) for n, m in (
            ("ln_1", dense.block.ln_1), ("ln_2", dense.block.ln_2), ("ln_f", dense.ln_f))})
        mods = {"c_attn": dense.block.c_attn, "c_proj": dense.block.c_proj, "c_fc": dense.block.c_fc,
                "mlp_proj": dense.block.mlp_proj, "head": dense.head}
        self.lin = nn.ModuleDict({n: ParallelLinear.from_dense(mods[n], dm, LinearScheme(s, r, dp, **o),
                                                               interleave=3 if n == "c_attn" else 1)
                                  for n, (s, r, dp, o) in linears.items()})

    def to(self, t: torch.Tensor, src: Layout, dst: Layout, shape: tuple[int, ...]) -> torch.Tensor:  # type: ignore[override]
        from layers3d import redistribute
        return redistribute(t, src, dst, self.dm, shape)

    def linear(self, name: str, t: torch.Tensor, src: Layout, k: int, n: int) -> tuple[torch.Tensor, Layout]:
        lin = self.lin[name]
        t = self.to(t, src, lin.input_layout((B, S, k)), (B, S, k))
        return lin(t), lin.output_layout((B, S, n))

    def block(self, x: torch.Tensor) -> torch.Tensor:
        qkv, q_lay = self.linear("c_attn", self.lns["ln_1"](x), self.res, H, 3 * H)
        heads = HEADS * qkv.shape[-1] // (3 * H)
        a, a_lay = self.linear("c_proj", attention(qkv, heads), Layout(q_lay.dims), H, H)
        x = x + self.to(a, a_lay, self.res, (B, S, H))
        h, h_lay = self.linear("c_fc", self.lns["ln_2"](x), self.res, H, 4 * H)
        m, m_lay = self.linear("mlp_proj", F.gelu(h), h_lay, 4 * H, H)
        return x + self.to(m, m_lay, self.res, (B, S, H))

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from layers3d import checkpoint, shard_tensor, vocab_parallel_cross_entropy

        mesh = self.dm.mesh
        x = self.wte(shard_tensor(ids, self.wte.ids_layout(ids.shape), mesh, self.dm.rank))
        x = checkpoint(self.block, x) if self.ckpt else self.block(x)
        logits, l_lay = self.linear("head", self.lns["ln_f"](x), self.res, H, V)
        t_local = shard_tensor(targets, Layout(l_lay.dims[:-1]), mesh, self.dm.rank)
        return vocab_parallel_cross_entropy(logits, t_local, self.dm, vocab_axes=l_lay.dims[-1],
                                            token_axes=_axes(l_lay, slice(0, -1)))

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        out = {f"wte.{k}": v for k, v in self.wte.dense_state_dict().items()}
        for n, m in self.lns.items():
            out.update({f"{'ln_f' if n == 'ln_f' else 'block.' + n}.{k}": v for k, v in m.dense_state_dict().items()})
        for n, m in self.lin.items():
            out.update({f"{'head' if n == 'head' else 'block.' + n}.{k}": v for k, v in m.dense_state_dict().items()})
        return out


def _train_mlp(dm, name: str, linears: dict) -> tuple[list, float]:  # noqa: ANN001
    """fc1 -> gelu -> fc2 with the plan's c_fc / mlp_proj schemes; MSE loss against a random target."""
    from cost_models.linear_scheme import LinearScheme
    from layers3d import ParallelLinear, redistribute, reduce_output, shard_tensor

    tokens, mesh = (8, 4), dm.mesh
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Linear(H, 3 * H), nn.GELU(), nn.Linear(3 * H, 10))
    par = nn.ModuleList([ParallelLinear.from_dense(dense[i], dm, LinearScheme(s, r, dp, **o))
                         for i, (s, r, dp, o) in ((0, linears["c_fc"]), (2, linears["mlp_proj"]))])
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (dense, par)]
    gen = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(3):
        x, t = torch.randn(*tokens, H, generator=gen), torch.randn(*tokens, 10, generator=gen)
        loss_d = F.mse_loss(dense(x), t)
        x_lay, h_lay = par[0].input_layout(x.shape), par[0].output_layout(tokens + (3 * H,))
        h = redistribute(F.gelu(par[0](shard_tensor(x, x_lay, mesh, dm.rank))), h_lay,
                         par[1].input_layout(tokens + (3 * H,)), dm, tokens + (3 * H,))
        y, y_lay = par[1](h), par[1].output_layout(t.shape)
        local = ((y - shard_tensor(t, y_lay, mesh, dm.rank)) ** 2).sum() / t.numel()
        loss_p = reduce_output(local, y_lay.axes(), dm, tag="loss")  # sum over the distinct blocks of y
        for loss, opt in ((loss_d, opts[0]), (loss_p, opts[1])):
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append([float(loss_d), float(loss_p)])
    worst = max(rel_err(par[j].dense_state_dict()[k], dense[i].state_dict()[k])
                for j, i in ((0, 0), (1, 2)) for k in ("weight", "bias"))
    return losses, worst


def _train_gpt(rank: int) -> dict:
    from layers3d import DeviceMesh

    dm = DeviceMesh(Mesh((2, 2, 2)))
    out = {("mlp", name): _train_mlp(dm, name, plan[1]) for name, plan in PLANS.items()}
    for name, plan in PLANS.items():
        for ckpt in (False, True) if name in ("3d", "mixed", "1d_sp") else (False,):
            torch.manual_seed(0)
            dense = GPT()
            par = ParallelGPT(dense, dm, plan, ckpt)
            opt_d = torch.optim.AdamW(dense.parameters(), lr=1e-2)
            opt_p = torch.optim.AdamW(par.parameters(), lr=1e-2)
            gen = torch.Generator().manual_seed(1)
            losses = []
            for _ in range(3):
                ids, targets = torch.randint(0, V, (B, S), generator=gen), torch.randint(0, V, (B, S), generator=gen)
                pair = []
                for model, opt in ((dense, opt_d), (par, opt_p)):
                    loss = model(ids, targets)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    pair.append(float(loss))
                losses.append(pair)
            state, want = par.dense_state_dict(), dense.state_dict()
            assert state.keys() == want.keys(), (name, sorted(state), sorted(want))
            # The key bias gets a gradient that is zero in exact arithmetic (softmax ignores a shift shared by
            # all keys), so AdamW turns round-off into updates of either sign: leave it out of the comparison.
            for sd in (state, want):
                sd["block.c_attn.bias"] = torch.cat([sd["block.c_attn.bias"][:H], sd["block.c_attn.bias"][2 * H:]])
            worst = max(rel_err(state[k], want[k]) for k in want)
            out[(name, ckpt)] = (losses, worst)
    return out


def test_mlp_and_gpt_train_like_dense_under_every_scheme() -> None:
    results = run_ranks(_train_gpt, 8, 150)
    for rank, res in enumerate(results):
        assert len(res) == 2 * len(PLANS) + 3
        for key, (losses, worst) in res.items():
            for dense_loss, par_loss in losses:
                assert abs(par_loss - dense_loss) <= 1e-5 * abs(dense_loss), (key, rank, losses)
            assert worst <= 1e-5, (key, rank, worst)
