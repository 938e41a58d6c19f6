"""Zoo vision models from Hugging Face transformers, tiny configs (no downloads): ViTForImageClassification.

ViT embeds patches with an nn.Conv2d (stride = kernel = patch size), prepends a class token with `cat`,
adds position embeddings, runs a BERT-like pre-LN encoder and classifies the class token."""

from __future__ import annotations

from typing import Any

import torch

from planner.models.loading import Example
from zoo import zoo_model


@zoo_model("hf-vit", "HF ViTForImageClassification: 16x16 images, patch 4, 2 layers, hidden 64, 4 heads, 16 labels",
           schemes=("replicate", "fsdp", "1d", "2d", "3d", "3d_allreduce"), requires=("transformers",))
def hf_vit(seed: int = 0, batch_size: int = 8, dropout: float = 0.0, **kw: Any) -> Example:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    config = ViTConfig(**{"image_size": 16, "patch_size": 4, "num_channels": 3, "hidden_size": 64,
                          "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                          "num_labels": 16, "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout,
                          "attn_implementation": "eager", **kw})
    model = ViTForImageClassification(config)
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(batch_size, config.num_channels, config.image_size, config.image_size, generator=g)
    labels = torch.randint(0, config.num_labels, (batch_size,), generator=g)
    return Example("hf-vit", model, {"pixel_values": pixels, "labels": labels}, "HF ViT image classifier (tiny)")
