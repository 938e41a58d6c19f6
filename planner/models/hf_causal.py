"""Hugging Face decoder-only models built from a config, never downloaded: the tiny Llama of the examples,
the LLaMA-3-8B shape (on the meta device), and any causal-LM architecture named by a config file.

HF models go through torch.export (they do not symbolic-trace); with transformers 5 the Llama family
(Llama, Mistral, Qwen2, GPT-NeoX) calls `scaled_dot_product_attention`, writes RMSNorm out by hand and
applies rotary embeddings with `rotate_half`. Example inputs are keyword arguments
`{"input_ids": ids, "labels": ids}`, so the model returns its loss.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from cost_models.errors import PlannerError

__all__ = ["HF_LLAMA_DEFAULTS", "LLAMA3_8B", "build_hf_causal_lm", "build_hf_llama", "build_llama3_8b",
           "build_from_config_file", "ConfigFileError"]


class ConfigFileError(PlannerError, ValueError):
    """A config file that cannot be read, names no causal-LM architecture, or whose model cannot be built."""


# LlamaConfig fields of the "hf-llama" example (grouped-query attention: 4 KV heads for 8 query heads),
# plus the example batch and sequence length.
HF_LLAMA_DEFAULTS: dict[str, Any] = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256,
                                     "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 512,
                                     "max_position_embeddings": 64, "batch_size": 8, "seq_len": 32}

# Meta's LLaMA-3-8B (config.json of meta-llama/Meta-Llama-3-8B), batch 64 x 2048 tokens, bf16.
LLAMA3_8B: dict[str, Any] = {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
                             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                             "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                             "batch_size": 64, "seq_len": 2048}


def _quiet_build(fn: Any) -> Any:
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return fn()
    finally:
        hf_logging.set_verbosity(verbosity)


def build_hf_causal_lm(config: Any, *, batch_size: int, seq_len: int, device: str | torch.device = "cpu",
                       seed: int = 0, dtype: torch.dtype = torch.float32, model_cls: Any = None
                       ) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """`model_cls(config)` (default AutoModelForCausalLM.from_config) on `device` with seeded weights, and
    keyword example inputs of `batch_size` x `seq_len` token ids."""
    from transformers import AutoModelForCausalLM

    if getattr(config, "_attn_implementation", None) in (None, "eager") and not getattr(
            config, "_planner_keep_attn", False):
        config._attn_implementation = "sdpa"
    device = torch.device(device)
    if device.type != "meta":
        torch.manual_seed(seed)

    def make() -> torch.nn.Module:
        with torch.device(device):
            return model_cls(config) if model_cls is not None else AutoModelForCausalLM.from_config(config)
    model = _quiet_build(make)
    model.loss_type = "ForCausalLM"
    model = model.to(dtype)
    vocab = int(config.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch_size, seq_len), generator=gen).to(device)
    return model, {"input_ids": ids, "labels": ids.clone()}


def build_hf_llama(*, device: str | torch.device = "cpu", seed: int = 0, dtype: torch.dtype = torch.float32,
                   **overrides: Any) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """Tiny LlamaForCausalLM; overrides are LlamaConfig fields or `batch_size` / `seq_len`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {**HF_LLAMA_DEFAULTS, **overrides}
    batch, seq = cfg.pop("batch_size"), cfg.pop("seq_len")
    config = LlamaConfig(**cfg)
    return build_hf_causal_lm(config, batch_size=batch, seq_len=seq, device=device, seed=seed, dtype=dtype,
                              model_cls=LlamaForCausalLM)


def build_llama3_8b(*, device: str | torch.device = "meta", seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                    **overrides: Any) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """LLaMA-3-8B's shape (meta device by default: 16 GB of bf16 weights otherwise)."""
    return build_hf_llama(device=device, seed=seed, dtype=dtype, **{**LLAMA3_8B, **overrides})


def build_from_config_file(path: str, *, batch_size: int, seq_len: int, device: str | torch.device = "meta",
                           dtype: torch.dtype | None = None) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A causal LM from an HF `config.json` (or a directory holding one): AutoConfig, then the
    architecture the config names (its `architectures` entry) or AutoModelForCausalLM, on `device`."""
    import transformers
    from transformers import AutoConfig

    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise ConfigFileError(f"{path}: no config.json there; pass an HF config file or the directory holding it")
    try:
        with open(file) as f:
            raw = json.load(f)
        config = AutoConfig.from_pretrained(file)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigFileError(f"{file}: not a Hugging Face model config ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); it needs a known \"model_type\"") from e
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal

    names = raw.get("architectures") or []
    causal_names = set(causal.values())
    cls = next((getattr(transformers, n) for n in names if n in causal_names and hasattr(transformers, n)), None)
    if cls is None and config.model_type not in causal:
        arch = names[0] if names else config.model_type
        raise ConfigFileError(f"{file}: {arch} is not a causal language model (model_type {config.model_type!r} "
                              f"has no AutoModelForCausalLM class); plan it with a factory file "
                              f"(path/to/file.py:factory) that builds it and its inputs")
    if dtype is None:
        dtype = getattr(torch, str(raw.get("torch_dtype") or raw.get("dtype") or "float32"), torch.float32)
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and seq_len > limit:
        raise ConfigFileError(f"{file}: --seq-len {seq_len} exceeds the config's max_position_embeddings {limit}; "
                              f"pass --seq-len {limit} or less")
    try:
        return build_hf_causal_lm(config, batch_size=batch_size, seq_len=seq_len, device=device, dtype=dtype,
                                  model_cls=cls)
    except Exception as e:
        arch = names[0] if names else config.model_type
        raise ConfigFileError(f"{file}: cannot build architecture {arch!r} as a causal LM "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); use a "
                              f"decoder-only model config or a factory file (path/to/file.py:factory)") from e
