"""Built-in example models by name, and user models from `path/to/file.py:factory` or `package.module:factory`.

A factory is a function called with no arguments that returns `(model, example_inputs)` or an `Example`.
`example_inputs` is a tuple of positional inputs (a single tensor is accepted too) or a dict of keyword
inputs (HF models: `{"input_ids": ids, "labels": ids}`); capture never reads their values, only shapes and
dtypes.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from cost_models.errors import PlannerError
from planner.models.gpt import GPT_SIZES, GPTConfigError, build_gpt
from planner.models.hf_causal import HF_LLAMA_DEFAULTS, LLAMA3_8B, build_hf_llama, build_llama3_8b
from planner.models.hf_gpt2 import HF_GPT2_DEFAULTS, build_hf_gpt2
from planner.models.mlp import MLP_DEFAULTS, build_mlp

__all__ = ["Example", "EXAMPLES", "ModelLoadError", "get_example", "load_model", "is_config_path"]

ExampleInputs = tuple[Any, ...] | dict[str, Any]


class ModelLoadError(PlannerError, ValueError):
    """A model spec that names no built-in example and no loadable factory, or a factory that failed."""


@dataclass
class Example:
    """A model with inputs to capture it on."""

    name: str
    model: nn.Module
    example_inputs: ExampleInputs
    """Positional inputs (tuple) or keyword inputs (dict)."""
    description: str = ""


def _gpt_line(name: str) -> str:
    c = GPT_SIZES[name]
    return (f"nanoGPT-style GPT, {c.n_layer} layers, hidden {c.n_embd}, {c.n_head} heads, vocab {c.vocab_size}, "
            f"seq {c.seq_len}, batch {c.batch_size}, dropout {c.dropout} (~{c.n_params / 1e6:,.1f}M parameters)")


EXAMPLES: dict[str, str] = {
    "mlp": (f"residual MLP classifier, {MLP_DEFAULTS['n_layer']} blocks Linear({MLP_DEFAULTS['dim']}, "
            f"{MLP_DEFAULTS['hidden']})-GELU-Linear, cross-entropy over {MLP_DEFAULTS['n_classes']} classes, "
            f"batch {MLP_DEFAULTS['batch_size']}"),
    **{name: _gpt_line(name) for name in GPT_SIZES},
    "hf-gpt2": (f"Hugging Face GPT2LMHeadModel from a config ({HF_GPT2_DEFAULTS['n_layer']} layers, hidden "
                f"{HF_GPT2_DEFAULTS['n_embd']}, vocab {HF_GPT2_DEFAULTS['vocab_size']}, eager attention, tied "
                f"head), batch {HF_GPT2_DEFAULTS['batch_size']}, seq {HF_GPT2_DEFAULTS['seq_len']}; captured "
                f"with torch.export"),
    "hf-llama": (f"Hugging Face LlamaForCausalLM from a config ({HF_LLAMA_DEFAULTS['num_hidden_layers']} layers, "
                 f"hidden {HF_LLAMA_DEFAULTS['hidden_size']}, {HF_LLAMA_DEFAULTS['num_attention_heads']} heads, "
                 f"{HF_LLAMA_DEFAULTS['num_key_value_heads']} KV heads, vocab {HF_LLAMA_DEFAULTS['vocab_size']}, "
                 f"SDPA attention), batch {HF_LLAMA_DEFAULTS['batch_size']}, seq {HF_LLAMA_DEFAULTS['seq_len']}"),
    "llama3-8b": (f"LLaMA-3-8B shape as HF LlamaForCausalLM on the meta device ({LLAMA3_8B['num_hidden_layers']} "
                  f"layers, hidden {LLAMA3_8B['hidden_size']}, {LLAMA3_8B['num_attention_heads']} heads, "
                  f"{LLAMA3_8B['num_key_value_heads']} KV heads, FFN {LLAMA3_8B['intermediate_size']}, vocab "
                  f"{LLAMA3_8B['vocab_size']}, bf16), batch {LLAMA3_8B['batch_size']} x {LLAMA3_8B['seq_len']}"),
}

# Built on the meta device unless asked otherwise: real weights would take GBs (gpt3-175b: 700 GB).
_META_BY_DEFAULT = ("gpt2-small", "gpt2-xl", "gpt3-175b", "llama3-8b")


def get_example(name: str, *, device: str | torch.device | None = None, **overrides: Any) -> Example:
    """Build built-in example `name` on `device` ("cpu" or "meta"; default: meta for the GPT-2/GPT-3 sizes,
    cpu for the small ones). Overrides: GPTConfig fields for the GPTs (n_layer, batch_size, seq_len,
    dropout, dtype...), MLP_DEFAULTS keys for "mlp", GPT2Config fields plus batch_size/seq_len for "hf-gpt2";
    `dtype` may be a name such as "bfloat16"; `seed` (default 0) seeds the weights and inputs of a real
    device, so two builds with the same arguments are identical."""
    if name not in EXAMPLES:
        raise ModelLoadError(f"unknown example {name!r}; built-in examples: {', '.join(EXAMPLES)}")
    if device is None:
        device = "meta" if name in _META_BY_DEFAULT else "cpu"
    if "dtype" in overrides:
        overrides["dtype"] = _dtype(overrides["dtype"])
    try:
        if name == "mlp":
            model, inputs = build_mlp(device=device, **overrides)
        elif name == "hf-gpt2":
            model, inputs = build_hf_gpt2(device=device, **overrides)
        elif name == "hf-llama":
            model, inputs = build_hf_llama(device=device, **overrides)
        elif name == "llama3-8b":
            model, inputs = build_llama3_8b(device=device, **overrides)
        else:
            model, inputs = build_gpt(name, device=device, **overrides)
    except (TypeError, ValueError, GPTConfigError) as e:
        raise ModelLoadError(f"cannot build example {name!r} with overrides {overrides}: {e}") from e
    return Example(name, model, inputs, EXAMPLES[name])


def _dtype(d: Any) -> torch.dtype:
    from planner.dtypes import TORCH_DTYPES, torch_dtype

    found = torch_dtype(d)
    if found is None:
        raise ModelLoadError(f"unknown dtype {d!r}; use one of {', '.join(TORCH_DTYPES)}")
    return found


def _default_seq_len(spec: str) -> int:
    """1024 tokens, or the config's max_position_embeddings when that is smaller."""
    import json

    file = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    try:
        with open(file) as f:
            limit = json.load(f).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return 1024
    return min(1024, limit) if isinstance(limit, int) and limit > 0 else 1024


def is_config_path(spec: str) -> bool:
    """True for an HF config file (`*.json`) or a directory holding a `config.json`."""
    return spec.endswith(".json") or (os.path.isdir(spec) and os.path.isfile(os.path.join(spec, "config.json")))


def load_model(spec: str, *, device: str | torch.device | None = None, batch_size: int | None = None,
               seq_len: int | None = None) -> Example:
    """A built-in example name, `path/to/file.py:factory`, `package.module:factory`, or a Hugging Face
    `config.json` (or a directory holding one) -> Example.

    device: for built-ins, where to build (see `get_example`); for factories, where to move the model and
    inputs afterwards ("meta" drops the weights and keeps only shapes), None to keep them as returned; a
    config is built on the meta device unless given. batch_size / seq_len: the example inputs of a config
    (default 8 x 1024)."""
    if spec in EXAMPLES:
        return get_example(spec, device=device)
    if is_config_path(spec):
        from planner.models.hf_causal import ConfigFileError, build_from_config_file

        batch, seq = batch_size or 8, seq_len or _default_seq_len(spec)
        try:
            model, inputs = build_from_config_file(spec, batch_size=batch, seq_len=seq, device=device or "meta")
        except ConfigFileError as e:
            raise ModelLoadError(str(e)) from e
        arch = type(model).__name__
        path = os.path.abspath(spec)
        name = os.path.basename(os.path.dirname(path) if os.path.basename(path) == "config.json" else path)
        return Example(name, model, inputs,
                       f"{arch} from {spec}, batch {batch} x {seq} tokens")
    source, sep, factory_name = spec.rpartition(":")
    if not sep or not source or not factory_name:
        raise ModelLoadError(f"unknown model {spec!r}: use a built-in example ({', '.join(EXAMPLES)}), "
                             f"'path/to/file.py:factory' or 'package.module:factory'")
    is_file = source.endswith(".py") or os.sep in source or "/" in source
    module = _import_file(source) if is_file else _import_module(source)
    factory = getattr(module, factory_name, None)
    if factory is None:
        raise ModelLoadError(f"{source} has no attribute {factory_name!r}: define `def {factory_name}(): "
                             f"return model, example_inputs` there, or name an existing factory")
    if not callable(factory):
        raise ModelLoadError(f"{source}:{factory_name} is a {type(factory).__name__}, not a function: it must be "
                             f"callable with no arguments and return (model, example_inputs)")
    with _on_path(os.path.dirname(os.path.abspath(source)) if is_file else None):
        result = _call(factory, spec)
    example = _as_example(result, spec, _short_name(source, factory_name, is_file))
    if device is not None:
        example = _moved(example, torch.device(device))
    return example


def _short_name(source: str, factory: str, is_file: bool) -> str:
    stem = os.path.splitext(os.path.basename(source))[0] if is_file else source
    return f"{stem}:{factory}"


@contextlib.contextmanager
def _on_path(directory: str | None) -> Iterator[None]:
    """Let a model file import its sibling modules while it loads and while its factory runs."""
    added = directory is not None and directory not in sys.path
    if added:
        sys.path.insert(0, directory)  # type: ignore[arg-type]
    try:
        yield
    finally:
        if added:
            sys.path.remove(directory)  # type: ignore[arg-type]


def _import_file(path: str) -> Any:
    if not os.path.isfile(path):
        raise ModelLoadError(f"model file {path!r} does not exist (working directory {os.getcwd()}); "
                             f"give a path to a .py file that defines the factory")
    full = os.path.abspath(path)
    mod_name = "_planner_model_" + hashlib.sha1(full.encode()).hexdigest()[:12]
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, full)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"cannot load {path!r} as a Python module; it must be a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        with _on_path(os.path.dirname(full)):
            spec.loader.exec_module(module)
    except SystemExit as e:  # sys.exit() in model code would end the planner with the model's status, silently
        del sys.modules[mod_name]
        raise ModelLoadError(f"importing {path} called sys.exit({e.code!r}); model code must not exit the "
                             "process: guard the script part with `if __name__ == \"__main__\":`") from e
    except Exception as e:
        del sys.modules[mod_name]
        raise ModelLoadError(f"importing {path} failed: {type(e).__name__}: {e}") from e
    return module


def _import_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except SystemExit as e:
        raise ModelLoadError(f"importing module {name!r} called sys.exit({e.code!r}); model code must not exit "
                             "the process: guard the script part with `if __name__ == \"__main__\":`") from e
    except ModuleNotFoundError as e:
        raise ModelLoadError(f"cannot import module {name!r} ({e}); check the name, install the package, or "
                             f"run from the directory that contains it") from e
    except Exception as e:
        raise ModelLoadError(f"importing module {name!r} failed: {type(e).__name__}: {e}") from e


def _call(factory: Callable[[], Any], spec: str) -> Any:
    try:
        return factory()
    except SystemExit as e:
        raise ModelLoadError(f"factory {spec} called sys.exit({e.code!r}) instead of returning (model, "
                             "example_inputs)") from e
    except Exception as e:
        raise ModelLoadError(f"factory {spec} raised {type(e).__name__}: {e}") from e


def _as_example(result: Any, spec: str, name: str) -> Example:
    if isinstance(result, Example):
        return result
    expected = ("expected (model, example_inputs) with model an nn.Module and example_inputs a tuple of "
                "tensors (or a dict of keyword inputs), or a planner.models.Example")
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise ModelLoadError(f"factory {spec} returned {_describe(result)}; {expected}")
    model, inputs = result
    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"factory {spec} returned a {type(model).__name__} as the model; {expected}")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    values = list(inputs.values()) if isinstance(inputs, dict) else list(inputs) if isinstance(inputs, tuple) else None
    if values is None or not any(isinstance(v, torch.Tensor) for v in values):
        raise ModelLoadError(f"factory {spec} returned example inputs {_describe(inputs)} with no tensor; "
                             f"{expected}")
    return Example(name, model, inputs, f"user model from {spec}")


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return f"a {type(value).__name__}"


def _moved(example: Example, device: torch.device) -> Example:
    def move(v: Any) -> Any:
        return v.to(device) if isinstance(v, torch.Tensor) else v

    inputs = example.example_inputs
    moved = {k: move(v) for k, v in inputs.items()} if isinstance(inputs, dict) else tuple(move(v) for v in inputs)
    return Example(example.name, example.model.to(device), moved, example.description)
