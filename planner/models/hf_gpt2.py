"""A tiny Hugging Face GPT-2 (`transformers.GPT2LMHeadModel`), built from a config, never downloaded.

It exercises the torch.export capture path: HF models do not symbolic-trace, use HF's Conv1D (a linear
whose weight is stored [in, out], exported as view -> addmm -> view) and the tanh GELU written out as
element-wise ops ("gelu_new"), and tie the vocabulary head to the token embedding (both ops then name
the parameter "transformer.wte.weight"). Eager attention keeps the explicit softmax in the graph.

Example inputs are keyword arguments: `{"input_ids": ids, "labels": ids}`, so the model returns its loss.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["HF_GPT2_DEFAULTS", "build_hf_gpt2"]

# GPT2Config fields of the "hf-gpt2" example, plus the example batch and sequence length.
HF_GPT2_DEFAULTS: dict[str, Any] = {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 256,
                                    "n_positions": 64, "batch_size": 4, "seq_len": 32}


def build_hf_gpt2(*, device: str | torch.device = "cpu", seed: int = 0, dtype: torch.dtype = torch.float32,
                  **overrides: Any) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The model and its keyword example inputs. Overrides are GPT2Config fields (e.g. `n_layer=4`,
    `tie_word_embeddings=False`) or `batch_size` / `seq_len`."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    cfg = {**HF_GPT2_DEFAULTS, **overrides}
    batch, seq = cfg.pop("batch_size"), cfg.pop("seq_len")
    if seq > cfg["n_positions"]:
        raise ValueError(f"seq_len={seq} exceeds n_positions={cfg['n_positions']}: raise n_positions")
    # Token ids outside a tiny vocabulary: HF warns about GPT-2's bos/eos ids, so set them inside it.
    cfg.setdefault("bos_token_id", cfg["vocab_size"] - 1)
    cfg.setdefault("eos_token_id", cfg["vocab_size"] - 1)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        config = GPT2Config(attn_implementation="eager", **cfg)
        device = torch.device(device)
        if device.type != "meta":
            torch.manual_seed(seed)
        with torch.device(device):
            model = GPT2LMHeadModel(config)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.loss_type = "ForCausalLM"  # what HF picks anyway, said explicitly so it does not warn
    model = model.to(dtype)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=gen).to(device)
    # labels == input_ids (HF shifts them inside), as a separate tensor: tracing treats one tensor passed
    # twice as one input read by two names.
    return model, {"input_ids": ids, "labels": ids.clone()}
