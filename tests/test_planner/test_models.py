"""Built-in example models and `load_model` for user factories."""

from __future__ import annotations

import math
import re
import textwrap

import pytest
import torch

from planner.models import EXAMPLES, GPT_SIZES, Example, ModelLoadError, get_example, gpt_config, load_model


def test_example_names_and_default_devices() -> None:
    assert list(EXAMPLES) == ["mlp", "gpt-tiny", "gpt2-small", "gpt2-xl", "gpt3-175b", "hf-gpt2", "hf-llama",
                              "llama3-8b"]
    assert next(get_example("mlp").model.parameters()).device.type == "cpu"
    with pytest.raises(ModelLoadError, match="built-in examples: mlp, gpt-tiny"):
        get_example("gpt5")


def test_llama3_8b_has_the_published_shape() -> None:
    pytest.importorskip("transformers")
    ex = get_example("llama3-8b")
    params = list(ex.model.parameters())
    assert {p.device.type for p in params} == {"meta"} and {p.dtype for p in params} == {torch.bfloat16}
    assert sum(p.numel() for p in params) == 8_030_261_248  # Meta-Llama-3-8B
    assert tuple(ex.example_inputs["input_ids"].shape) == (64, 2048)


@pytest.mark.parametrize("name", list(GPT_SIZES))
def test_gpt_sizes(name: str) -> None:
    c = GPT_SIZES[name]
    ex = get_example(name)  # real weights for gpt-tiny only; the others default to the meta device
    device = "cpu" if name == "gpt-tiny" else "meta"
    assert {p.device.type for p in ex.model.parameters()} == {t.device.type for t in ex.example_inputs} == {device}
    assert sum(p.numel() for p in ex.model.parameters()) == c.n_params
    assert len(ex.model.transformer.h) == c.n_layer
    assert [tuple(t.shape) for t in ex.example_inputs] == [(c.batch_size, c.seq_len)] * 2
    assert all(t.dtype == torch.int64 for t in ex.example_inputs)


def test_named_sizes() -> None:
    got = {n: (c.n_layer, c.n_embd, c.n_head, c.vocab_size, c.seq_len, c.batch_size) for n, c in GPT_SIZES.items()}
    assert got == {"gpt-tiny": (2, 64, 4, 128, 16, 8), "gpt2-small": (12, 768, 12, 50304, 1024, 8),
                   "gpt2-xl": (48, 1600, 25, 50304, 1024, 16), "gpt3-175b": (96, 12288, 96, 50304, 2048, 16)}
    assert round(GPT_SIZES["gpt3-175b"].n_params / 1e9) == 175


def test_gpt_tiny_trains_like_a_language_model() -> None:
    ex = get_example("gpt-tiny")
    idx, targets = ex.example_inputs
    loss = ex.model(idx, targets)
    assert loss.shape == () and abs(loss.item() - math.log(128)) < 0.3  # near-uniform at init
    loss.backward()
    assert all(p.grad is not None for p in ex.model.parameters())  # every parameter is used
    assert ex.model(idx).shape == (8, 16, 128)
    # causal: the logits at position t do not depend on tokens after t
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 128
    with torch.no_grad():
        torch.testing.assert_close(ex.model(idx)[:, :10], ex.model(changed)[:, :10])
    # same seed, same model
    torch.testing.assert_close(get_example("gpt-tiny").model(idx, targets), loss)


def test_gpt_overrides() -> None:
    ex = get_example("gpt2-xl", n_layer=2, batch_size=4, seq_len=64, dropout=0.0, dtype="bfloat16")
    assert len(ex.model.transformer.h) == 2 and tuple(ex.example_inputs[0].shape) == (4, 64)
    assert {p.dtype for p in ex.model.parameters()} == {torch.bfloat16}
    assert ex.model.transformer.h[0].attn.attn_dropout.p == 0.0
    assert gpt_config("gpt-tiny", n_head=8).head_dim == 8
    with pytest.raises(ModelLoadError, match="valid fields"):
        get_example("gpt-tiny", layers=3)
    with pytest.raises(ModelLoadError, match="not a multiple of n_head"):
        get_example("gpt-tiny", n_head=5)
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        get_example("gpt-tiny", dtype="float7")


def test_mlp_example() -> None:
    ex = get_example("mlp")
    x, targets = ex.example_inputs
    assert tuple(x.shape) == (32, 64) and tuple(targets.shape) == (32,)
    loss = ex.model(x, targets)
    assert loss.shape == () and loss.item() > 0
    assert len(ex.model.blocks) == 2
    assert len(get_example("mlp", n_layer=3, dim=16).model.blocks) == 3
    assert torch.equal(get_example("mlp", seed=3).model.head.weight, get_example("mlp", seed=3).model.head.weight)
    assert not torch.equal(get_example("mlp", seed=4).model.head.weight, ex.model.head.weight)
    with pytest.raises(ModelLoadError, match="unknown MLP override"):
        get_example("mlp", width=3)


def test_hf_gpt2_example() -> None:
    ex = get_example("hf-gpt2", n_layer=1)
    assert type(ex.model).__name__ == "GPT2LMHeadModel"
    assert set(ex.example_inputs) == {"input_ids", "labels"}
    out = ex.model(**ex.example_inputs, use_cache=False)
    assert out.loss.shape == () and tuple(out.logits.shape) == (4, 32, 256)
    assert ex.model.config._attn_implementation == "eager"


def test_load_builtin_and_device() -> None:
    ex = load_model("gpt-tiny", device="meta")
    assert ex.name == "gpt-tiny" and next(ex.model.parameters()).device.type == "meta"
    assert ex.description == EXAMPLES["gpt-tiny"]


def _write(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_load_from_file(tmp_path) -> None:
    _write(tmp_path, "helper.py", "WIDTH = 3\n")
    path = _write(tmp_path, "mymodel.py", """
        import torch
        from helper import WIDTH  # sibling modules import
        from planner.models import Example

        def make():
            return torch.nn.Linear(WIDTH, 2), (torch.randn(4, WIDTH),)

        def make_example():
            return Example("lin", torch.nn.Linear(2, 2), {"input": torch.randn(1, 2)}, "a linear")

        def single():
            return torch.nn.Linear(3, 2), torch.randn(4, 3)
    """)
    ex = load_model(f"{path}:make")
    assert isinstance(ex, Example) and ex.name == "mymodel:make"
    assert isinstance(ex.model, torch.nn.Linear) and tuple(ex.example_inputs[0].shape) == (4, 3)
    assert load_model(f"{path}:make_example").example_inputs.keys() == {"input"}
    assert load_model(f"{path}:single").example_inputs[0].shape == (4, 3)
    moved = load_model(f"{path}:make", device="meta")
    assert moved.model.weight.device.type == "meta" and moved.example_inputs[0].device.type == "meta"


def test_load_from_module(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    _write(pkg, "nets.py", """
        import torch
        def build():
            return torch.nn.Linear(2, 2), (torch.randn(1, 2),)
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    ex = load_model("userpkg.nets:build")
    assert ex.name == "userpkg.nets:build" and isinstance(ex.model, torch.nn.Linear)


def test_load_errors(tmp_path) -> None:
    path = _write(tmp_path, "bad.py", """
        import torch
        NOT_CALLABLE = 3
        def raises():
            raise RuntimeError("weights not found")
        def not_tuple():
            return torch.nn.Linear(2, 2)
        def not_module():
            return "model", (torch.randn(1),)
        def no_tensor():
            return torch.nn.Linear(2, 2), (1, 2)
    """)
    broken = _write(tmp_path, "broken.py", "import torch\nraise ImportError('needs apex')\n")
    cases = {
        "nomodel": "unknown model 'nomodel': use a built-in example",
        f"{tmp_path}/missing.py:make": "does not exist",
        "no_such_pkg_xyz.models:make": "cannot import module 'no_such_pkg_xyz.models'",
        f"{path}:missing": "has no attribute 'missing': define `def missing(): return model, example_inputs`",
        f"{path}:NOT_CALLABLE": "is a int, not a function",
        f"{path}:raises": "raised RuntimeError: weights not found",
        f"{path}:not_tuple": "returned a Linear; expected (model, example_inputs)",
        f"{path}:not_module": "returned a str as the model",
        f"{path}:no_tensor": "with no tensor",
        f"{broken}:make": "broken.py failed: ImportError: needs apex",
    }
    for spec, message in cases.items():
        with pytest.raises(ModelLoadError, match=re.escape(message)):
            load_model(spec)
    assert issubclass(ModelLoadError, ValueError)


def test_gpt_block_saves_the_textbook_activations() -> None:
    """One Block in bf16 with dropout on CPU keeps sbh(36 + 6as/h) bytes for backward (Korthikanti et al.'s
    sbh(34 + 5as/h) with CPU's 2-byte dropout masks), plus the layer norms' mean/rstd per token."""
    from planner.models.gpt import Block

    cfg = gpt_config("gpt-tiny", seq_len=32, batch_size=4, dropout=0.1, dtype=torch.bfloat16)
    torch.manual_seed(0)
    block = Block(cfg).to(torch.bfloat16)
    s, b, h, a = cfg.seq_len, cfg.batch_size, cfg.n_embd, cfg.n_head
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()}
    skip.add(block.attn.mask.untyped_storage().data_ptr())
    saved: dict[int, tuple[tuple[int, ...], int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = (tuple(t.shape), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    stats = [n for shape, n in saved.values() if shape == (b, s, 1)]
    activations = sum(n for shape, n in saved.values() if shape != (b, s, 1))
    assert len(stats) == 4  # mean and rstd of each of the two layer norms
    assert activations == s * b * h * (36 + 6 * a * s // h)
