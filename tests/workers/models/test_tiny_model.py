"""The built-in tiny model directory loads like any Hugging Face model and its tokenizer is lossless."""

from __future__ import annotations

import pathlib

import pytest

from plrl_workers.models import tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tiny.build(tmp_path_factory.mktemp("tiny"))


def test_tokenizer_round_trips_every_task_character(model_dir: pathlib.Path) -> None:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    text = "Q: 12+34=? A: 46\n" + tiny.CHARACTERS
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.eos_token_id == tiny.vocabulary()[tiny.EOS]


def test_build_is_reused_and_deterministic(model_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    import safetensors.torch

    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    tiny.build(model_dir)
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before
    other = tiny.build(tmp_path / "again")
    a = safetensors.torch.load_file(str(model_dir / "model.safetensors"))
    b = safetensors.torch.load_file(str(other / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a)


def test_head_dim_must_be_64() -> None:
    with pytest.raises(ValueError, match="must be 64"):
        tiny.TinyModelConfig(hidden_size=96, num_attention_heads=2)
