"""Llama-family decoders: tiny HF Llama (grouped-query attention), Mistral, Qwen2 (q/k/v biases),
GPT-NeoX (fused q/k/v per head, partial rotary, parallel residual) and a torchtitan-style Llama written in
plain torch (nn.RMSNorm, complex rotary embeddings, `F.scaled_dot_product_attention`, bias-free
nn.Linear, `type_as`). 2 layers, hidden 128, 8 heads (4 KV heads where the family has GQA), vocab 512,
batch 8, sequence 32; no dropout, so a dense and a parallel run compute the same numbers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from planner.models.hf_causal import build_hf_causal_lm
from planner.models.loading import Example
from zoo import zoo_model

__all__ = ["TitanLlama", "TitanArgs"]

BATCH, SEQ = 8, 32
_HF = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 8,
       "vocab_size": 512, "max_position_embeddings": 64}
_HF_REQUIRES = ("transformers",)


def _hf(name: str, config: Any, seed: int, **kw: Any) -> Example:
    model, inputs = build_hf_causal_lm(config, batch_size=BATCH, seq_len=SEQ, seed=seed, **kw)
    return Example(name, model, inputs, type(model).__name__)


@zoo_model("hf-llama", "LlamaForCausalLM, 8 heads / 4 KV heads, SDPA, RMSNorm, rotate_half RoPE, SwiGLU",
           requires=_HF_REQUIRES)
def hf_llama(seed: int = 0, **overrides: Any) -> Example:
    from transformers import LlamaConfig

    return _hf("hf-llama", LlamaConfig(**{**_HF, "num_key_value_heads": 4, **overrides}), seed)


@zoo_model("hf-mistral", "MistralForCausalLM, 8 heads / 4 KV heads, sliding-window config", requires=_HF_REQUIRES)
def hf_mistral(seed: int = 0, **overrides: Any) -> Example:
    from transformers import MistralConfig

    return _hf("hf-mistral", MistralConfig(**{**_HF, "num_key_value_heads": 4, "sliding_window": 64,
                                              **overrides}), seed)


@zoo_model("hf-qwen2", "Qwen2ForCausalLM, 8 heads / 2 KV heads, q/k/v with biases", requires=_HF_REQUIRES)
def hf_qwen2(seed: int = 0, **overrides: Any) -> Example:
    from transformers import Qwen2Config

    return _hf("hf-qwen2", Qwen2Config(**{**_HF, "num_key_value_heads": 2, **overrides}), seed)


@zoo_model("hf-gpt-neox", "GPTNeoXForCausalLM: fused q/k/v per head, 25% rotary, parallel residual, LayerNorm",
           requires=_HF_REQUIRES)
def hf_gpt_neox(seed: int = 0, **overrides: Any) -> Example:
    from transformers import GPTNeoXConfig

    cfg = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 8,
           "vocab_size": 512, "max_position_embeddings": 64, "rotary_pct": 0.25, "use_parallel_residual": True,
           "attention_dropout": 0.0, "hidden_dropout": 0.0, **overrides}
    return _hf("hf-gpt-neox", GPTNeoXConfig(**cfg), seed)


# --- a torchtitan-style Llama in plain torch ------------------------------------------------------------
class TitanArgs:
    """The model's shape (torchtitan's ModelArgs, reduced to what the model reads)."""

    def __init__(self, dim: int = 128, n_layers: int = 2, n_heads: int = 8, n_kv_heads: int = 4,
                 vocab_size: int = 512, ffn_dim: int = 256, norm_eps: float = 1e-5, rope_theta: float = 10000.0,
                 max_seq_len: int = 64) -> None:
        self.dim, self.n_layers, self.n_heads, self.n_kv_heads = dim, n_layers, n_heads, n_kv_heads
        self.vocab_size, self.ffn_dim, self.norm_eps = vocab_size, ffn_dim, norm_eps
        self.rope_theta, self.max_seq_len = rope_theta, max_seq_len


def precompute_freqs_cis(dim: int, end: int, theta: float) -> torch.Tensor:
    """Complex rotations e^(i t f) for positions t < end and dim/2 frequencies f: [end, dim/2] complex64."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate pairs of the head dim: xq [B, S, H, D] -> view_as_complex [B, S, H, D/2] * freqs -> real."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs = freqs_cis[: xq.shape[1]].view(1, xq.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, S, Hkv, D] -> [B, S, Hkv * n_rep, D]: each KV head repeated for its group of query heads."""
    bs, slen, n_kv, hd = x.shape
    if n_rep == 1:
        return x
    return torch.unsqueeze(x, dim=3).expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


class Attention(nn.Module):
    def __init__(self, a: TitanArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * self.head_dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)   # (B, S, H, D)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)   # (B, S, Hkv, D)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        n_rep = self.n_heads // self.n_kv_heads
        keys, values = repeat_kv(xk, n_rep), repeat_kv(xv, n_rep)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             is_causal=True)  # (B, H, S, D)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, a: TitanArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.ffn_dim, bias=False)
        self.w2 = nn.Linear(a.ffn_dim, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU


class TransformerBlock(nn.Module):
    def __init__(self, a: TitanArgs) -> None:
        super().__init__()
        self.attention, self.feed_forward = Attention(a), FeedForward(a)
        self.attention_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class TitanLlama(nn.Module):
    """torchtitan's Llama 3 reduced to one file; forward(tokens, labels) returns the mean cross-entropy."""

    def __init__(self, a: TitanArgs) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.register_buffer("freqs_cis", precompute_freqs_cis(a.dim // a.n_heads, a.max_seq_len * 2, a.rope_theta),
                             persistent=True)
        self.layers = nn.ModuleList(TransformerBlock(a) for _ in range(a.n_layers))
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


@zoo_model("titan-llama", "torchtitan-style Llama 3 in plain torch: nn.RMSNorm, complex RoPE, SDPA, GQA, type_as")
def titan_llama(seed: int = 0, **overrides: Any) -> Example:
    torch.manual_seed(seed)
    model = TitanLlama(TitanArgs(**overrides))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.output.out_features, (BATCH, SEQ), generator=gen)
    return Example("titan-llama", model, (ids, ids.clone()), "torchtitan-style Llama")
