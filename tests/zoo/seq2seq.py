"""Zoo encoder-decoder models from Hugging Face transformers, tiny configs (no downloads):
T5ForConditionalGeneration (relative position bias, RMS-style T5LayerNorm, tied embeddings, cross-attention)."""

from __future__ import annotations

from typing import Any

import torch

from planner.models.loading import Example
from zoo import zoo_model


@zoo_model("hf-t5", "HF T5ForConditionalGeneration: 2+2 layers, d_model 64, 4 heads, vocab 128, seq 16",
           schemes=("replicate", "fsdp", "1d", "2d", "3d", "3d_allreduce"), requires=("transformers",))
def hf_t5(seed: int = 0, batch_size: int = 8, seq_len: int = 16, dropout: float = 0.0, **kw: Any) -> Example:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(**{"vocab_size": 128, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2,
                         "num_decoder_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8,
                         "dropout_rate": dropout, "decoder_start_token_id": 0, "pad_token_id": 0,
                         "attn_implementation": "eager", **kw})
    model = T5ForConditionalGeneration(config)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, config.vocab_size, (batch_size, seq_len), generator=g)
    labels = torch.randint(1, config.vocab_size, (batch_size, seq_len), generator=g)
    return Example("hf-t5", model, {"input_ids": ids, "labels": labels}, "HF T5 encoder-decoder (tiny)")
