"""Tiny Hugging Face models built from configs (never downloaded), for the solver benches.

2 layers, hidden 64, 4 heads (2 KV heads where the family has GQA), FFN 128, vocab 512, batch 8 x 32,
eager attention, dropout off; inputs `{"input_ids", "labels"}` so the model returns its loss (BERT: a
masked-LM head with labels). `llama3_8b_meta()` is the LLaMA-3-8B shape on the meta device.
These are local builders on purpose: the benches must not depend on the test zoo.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["HF_TINY", "build_hf_tiny", "llama3_8b_meta"]

_COMMON = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
               max_position_embeddings=64)


def _causal(config_cls: str, model_cls: str, **extra: Any) -> tuple[str, str, dict[str, Any]]:
    return config_cls, model_cls, {**_COMMON, **extra}


HF_TINY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "hf-llama": _causal("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2),
    "hf-mistral": _causal("MistralConfig", "MistralForCausalLM", num_key_value_heads=2, sliding_window=None),
    "hf-qwen2": _causal("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2),
    "hf-gpt-neox": _causal("GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_dropout=0.0, attention_dropout=0.0),
    "hf-opt": ("OPTConfig", "OPTForCausalLM",
               dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                    max_position_embeddings=64, word_embed_proj_dim=64, dropout=0.0, attention_dropout=0.0)),
    "hf-bert": ("BertConfig", "BertForMaskedLM",
                dict(_COMMON, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
}


def build_hf_tiny(name: str, *, batch: int = 8, seq: int = 32, seed: int = 0,
                  device: str = "cpu") -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The model `name` of `HF_TINY` and its keyword example inputs (input_ids, labels)."""
    import transformers
    from transformers.utils import logging as hf_logging

    config_cls, model_cls, cfg = HF_TINY[name]
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        config = getattr(transformers, config_cls)(attn_implementation="eager", **cfg)
        if device != "meta":
            torch.manual_seed(seed)
        with torch.device(device):
            model = getattr(transformers, model_cls)(config)
    finally:
        hf_logging.set_verbosity(verbosity)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=gen).to(device)
    return model, {"input_ids": ids, "labels": ids.clone()}


def bench_graph(name: str):
    """The captured graph of a tiny HF config (`HF_TINY`) or of a built-in example, by name."""
    from planner import get_example
    from planner.trace.tracer import capture

    if name in HF_TINY:
        model, inputs = build_hf_tiny(name)
    else:
        ex = get_example(name)
        model, inputs = ex.model, ex.example_inputs
    return capture(model, inputs, name=name)


def llama3_8b_meta(batch: int = 64, seq: int = 2048) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """LLaMA-3-8B's shape (32 layers, hidden 4096, 32 heads, 8 KV heads, FFN 14336, vocab 128256) in bf16
    on the meta device, with meta inputs of batch x seq."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    cfg = LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=14336, vocab_size=128256, max_position_embeddings=seq,
                      attn_implementation="eager", torch_dtype=torch.bfloat16)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    finally:
        hf_logging.set_verbosity(verbosity)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return model, {"input_ids": ids, "labels": ids.clone()}
