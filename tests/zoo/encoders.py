"""Zoo: Hugging Face BERT (post-LN encoder, masked-LM head tied to the word embedding) and OPT (pre-LN
decoder, learned positions offset by 2), tiny configs built on CPU, never downloaded.

Both compute their own loss (`labels` passed), so the vocabulary-parallel loss runs inside the wrapped HF
model. Eager attention: `scaled_dot_product_attention` is not an op family of the planner yet. Dropout is 0
unless overridden (`dropout=0.1` sets every dropout probability of the config).
"""

from __future__ import annotations

from typing import Any

import torch

from planner.models.loading import Example
from zoo import zoo_model

__all__ = ["hf_bert", "hf_opt", "hf_bert_dropout"]

BATCH, SEQ, VOCAB = 8, 32, 512


def _quiet_build(cls: Any, config: Any, seed: int) -> torch.nn.Module:
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        torch.manual_seed(seed)
        return cls(config)
    finally:
        hf_logging.set_verbosity(verbosity)


def _ids(vocab: int, batch: int, seq: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


@zoo_model("hf-bert", "BertForMaskedLM: 2 layers, hidden 64, 4 heads, vocab 512, batch 8 x 32 tokens",
           requires=("transformers",))
def hf_bert(*, dropout: float = 0.0, seed: int = 0, batch_size: int = BATCH, seq_len: int = SEQ,
            **config: Any) -> Example:
    """BertForMaskedLM(BertConfig(...)) with `{"input_ids", "labels"}` inputs; overrides are BertConfig fields."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 256, "max_position_embeddings": 64, "hidden_dropout_prob": dropout,
           "attention_probs_dropout_prob": dropout, "attn_implementation": "eager", **config}
    model = _quiet_build(BertForMaskedLM, BertConfig(**cfg), seed)
    ids = _ids(cfg["vocab_size"], batch_size, seq_len, seed)
    return Example("hf-bert", model, {"input_ids": ids, "labels": ids.clone()}, "tiny BertForMaskedLM")


@zoo_model("hf-opt", "OPTForCausalLM: 2 layers, hidden 64, 4 heads, ffn 256, vocab 512, batch 8 x 32 tokens",
           requires=("transformers",))
def hf_opt(*, dropout: float = 0.0, seed: int = 0, batch_size: int = BATCH, seq_len: int = SEQ,
           **config: Any) -> Example:
    """OPTForCausalLM(OPTConfig(...)) with `{"input_ids", "labels"}` inputs; overrides are OPTConfig fields."""
    from transformers import OPTConfig, OPTForCausalLM

    cfg = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "ffn_dim": 256, "max_position_embeddings": 64, "word_embed_proj_dim": 64, "dropout": dropout,
           "attention_dropout": dropout, "activation_dropout": dropout, "layerdrop": 0.0,
           "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2, "attn_implementation": "eager", **config}
    model = _quiet_build(OPTForCausalLM, OPTConfig(**cfg), seed)
    ids = _ids(cfg["vocab_size"], batch_size, seq_len, seed)
    ids[ids == cfg["pad_token_id"]] = 3  # no padding: every token counts in the loss
    return Example("hf-opt", model, {"input_ids": ids, "labels": ids.clone()}, "tiny OPTForCausalLM")


def hf_bert_dropout() -> Example:
    """hf-bert with BERT's default dropout 0.1 (a factory for `planner verify tests/zoo/encoders.py:...`)."""
    return hf_bert(dropout=0.1)
