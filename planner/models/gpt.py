"""A nanoGPT-style GPT written for one device, readable top to bottom.

LayerNorm -> CausalSelfAttention -> MLP -> Block -> GPT, as in Karpathy's nanoGPT, with three deliberate
choices so that the captured graph is the textbook one the cost model expects:

* attention is computed by hand (q @ k^T * scale, causal masked_fill, softmax, dropout, @ v), never with
  `scaled_dot_product_attention`, so the saved activations are those of Korthikanti et al. 2022;
* the vocabulary head is not tied to the token embedding, so every parameter belongs to exactly one op;
* `forward` has no data-dependent Python control flow (no `assert` on the sequence length), so
  `torch.fx.symbolic_trace` can trace it.

Named sizes (`GPT_SIZES`) and their default example batch sizes (chosen so that planning at 8, 64 and
512 ranks is meaningful: the batch alone cannot absorb 64 or 512 ranks, so tensor parallelism matters):

| name      | n_layer | n_embd | n_head | vocab | seq  | batch | dropout |
|-----------|---------|--------|--------|-------|------|-------|---------|
| gpt-tiny  | 2       | 64     | 4      | 128   | 16   | 8     | 0.0     |
| gpt2-small| 12      | 768    | 12     | 50304 | 1024 | 8     | 0.1     |
| gpt2-xl   | 48      | 1600   | 25     | 50304 | 1024 | 16    | 0.1     |
| gpt3-175b | 96      | 12288  | 96     | 50304 | 2048 | 16    | 0.1     |

gpt-tiny has no dropout so that a parallel run can be compared exactly with the dense model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from cost_models.errors import PlannerError

__all__ = ["GPTConfig", "GPT_SIZES", "GPT", "Block", "CausalSelfAttention", "MLP", "gpt_config", "build_gpt",
           "GPTConfigError"]


class GPTConfigError(PlannerError, ValueError):
    """An unknown GPT size name or an invalid override."""


@dataclass(frozen=True)
class GPTConfig:
    """Architecture and example-input sizes of one GPT."""

    n_layer: int
    """Number of transformer blocks."""
    n_embd: int
    """Hidden size h."""
    n_head: int
    """Attention heads a; n_embd must be a multiple of it."""
    vocab_size: int
    """Vocabulary size (50304 = GPT-2's 50257 rounded up to a multiple of 64, as in nanoGPT)."""
    seq_len: int
    """Sequence length s of the example inputs, and the longest sequence the model accepts."""
    batch_size: int
    """Batch size b of the example inputs."""
    dropout: float = 0.0
    """Dropout probability after the embeddings, on the attention weights and after each residual branch."""
    bias: bool = True
    """Whether the linears and layer norms have biases (GPT-2 has them)."""
    dtype: torch.dtype = torch.float32
    """Parameter dtype."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "vocab_size", "seq_len", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise GPTConfigError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise GPTConfigError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head}: "
                                 f"choose n_head that divides n_embd")
        if not 0.0 <= self.dropout < 1.0:
            raise GPTConfigError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_params(self) -> int:
        """Parameter count in closed form (12h^2 + 13h per block, embeddings, final norm, head)."""
        h, b = self.n_embd, int(self.bias)
        per_block = 12 * h * h + (3 * h + h + 4 * h + h) * b + 2 * (h + h * b)
        return (self.vocab_size * h + self.seq_len * h + self.n_layer * per_block + (h + h * b)
                + h * self.vocab_size)


GPT_SIZES: dict[str, GPTConfig] = {
    "gpt-tiny": GPTConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=128, seq_len=16, batch_size=8, dropout=0.0),
    "gpt2-small": GPTConfig(n_layer=12, n_embd=768, n_head=12, vocab_size=50304, seq_len=1024, batch_size=8,
                            dropout=0.1),
    "gpt2-xl": GPTConfig(n_layer=48, n_embd=1600, n_head=25, vocab_size=50304, seq_len=1024, batch_size=16,
                         dropout=0.1),
    "gpt3-175b": GPTConfig(n_layer=96, n_embd=12288, n_head=96, vocab_size=50304, seq_len=2048, batch_size=16,
                           dropout=0.1),
}


def gpt_config(size: str = "gpt-tiny", **overrides: object) -> GPTConfig:
    """The config of a named size with fields overridden, e.g. `gpt_config("gpt2-xl", n_layer=4)`."""
    if size not in GPT_SIZES:
        raise GPTConfigError(f"unknown GPT size {size!r}; choose one of {sorted(GPT_SIZES)}")
    known = {f.name for f in fields(GPTConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise GPTConfigError(f"unknown GPT override(s) {unknown}; valid fields are {sorted(known)}")
    return replace(GPT_SIZES[size], **overrides)  # type: ignore[arg-type]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused q/k/v projection and explicit softmax."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # True above the diagonal: the future positions a token may not attend to.
        mask = torch.ones(config.seq_len, config.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask.view(1, 1, config.seq_len, config.seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()  # batch, sequence, hidden
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * self.scale  # (B, nh, T, T)
        att = att.masked_fill(self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """h -> 4h -> GELU -> h."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """The language model: forward(idx, targets) -> loss, or logits when targets is None."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.seq_len, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        b, t = idx.size()  # (B, T) token ids
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # (T,)
        tok_emb = self.transformer.wte(idx)  # (B, T, C)
        pos_emb = self.transformer.wpe(pos)  # (T, C)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)  # (B, T, vocab)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def build_gpt(size: str = "gpt-tiny", *, device: str | torch.device = "cpu", seed: int = 0,
              **overrides: object) -> tuple[GPT, tuple[torch.Tensor, torch.Tensor]]:
    """Build a named GPT and its example inputs `(idx, targets)`, both (batch, seq) int64.

    On the meta device nothing is allocated: parameters and inputs only carry shapes and dtypes, which is
    all capture needs (gpt3-175b builds in about a second). On a real device the weights are initialised
    with `seed` and the inputs are random token ids.
    """
    config = gpt_config(size, **overrides)
    device = torch.device(device)
    if device.type != "meta":
        torch.manual_seed(seed)  # the weight init draws from the global generator
    with torch.device(device):
        model = GPT(config)
    if config.dtype != torch.float32:
        model = model.to(config.dtype)
    shape = (config.batch_size, config.seq_len)
    if device.type == "meta":
        idx = torch.empty(shape, dtype=torch.long, device=device)
        targets = torch.empty(shape, dtype=torch.long, device=device)
    else:
        gen = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, config.vocab_size, shape, generator=gen).to(device)
        targets = torch.randint(0, config.vocab_size, shape, generator=gen).to(device)
    return model, (idx, targets)
