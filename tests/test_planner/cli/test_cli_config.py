"""`planner plan path/to/config.json`: a Hugging Face architecture planned from its config alone (built on
the meta device with AutoConfig + the causal-LM class it names), and one-line errors for configs that
cannot be built or captured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli.app import main
from planner.plans.format import Plan

pytest.importorskip("transformers")


def _llama_config(directory: Path) -> Path:
    from transformers import LlamaConfig

    LlamaConfig(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                num_key_value_heads=4, vocab_size=1024, max_position_embeddings=128,
                architectures=["LlamaForCausalLM"]).save_pretrained(directory)
    return directory / "config.json"


def test_plans_a_llama_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _llama_config(tmp_path / "llama")
    out = tmp_path / "plan.json"
    code = main(["plan", str(config), "--budget", "80GiB", "--world-size", "64", "--batch-size", "64",
                 "--seq-len", "128", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    p = Plan.load(str(out))
    assert p.feasible and p.world_size == 64
    kinds = {a.kind for a in p.assignments}
    assert {"attention", "rms_norm", "linear", "embedding"} <= kinds
    assert p.model.name == "llama"


def test_a_directory_holding_the_config_works_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _llama_config(tmp_path / "llama")
    code = main(["plan", str(tmp_path / "llama"), "--budget", "80GiB", "--world-size", "8", "--seq-len", "64",
                 "--out", str(tmp_path / "p.json")])
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("content, words", [
    ({"model_type": "nosuchmodel"}, "not a Hugging Face model config"),
    ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}, "is not a causal language model"),
])
def test_unbuildable_config_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              content: dict, words: str) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(content))
    code = main(["plan", str(config), "--budget", "80GiB", "--world-size", "8", "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1, err


def test_sequence_longer_than_the_positions_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _llama_config(tmp_path / "llama")
    code = main(["plan", str(config), "--budget", "80GiB", "--world-size", "8", "--seq-len", "4096",
                 "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "max_position_embeddings 128" in err and len(err.splitlines()) == 1, err
