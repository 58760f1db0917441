"""`training.save_hf_model` (the torch backend's checkpoint `model/`): the directory transformers'
`save_pretrained` would write, readable by `from_pretrained` and by the trainer's own loader, the
tied lm_head stored once, and written without importing DeepSpeed."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import torch

from plrl_workers.engines import training


def test_the_saved_directory_is_what_save_pretrained_writes(
    tiny_model_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    import safetensors.torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # not the weights on disk
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    training.save_hf_model(model, ours)
    model.save_pretrained(str(theirs))
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
    assert safetensors.torch.load_file(str(ours / "model.safetensors")).keys() == (
        safetensors.torch.load_file(str(theirs / "model.safetensors")).keys()
    )
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(ours), dtype=torch.float32)
    for (name, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    fresh = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    training.load_hf_weights(fresh, ours)
    torch.testing.assert_close(fresh.lm_head.weight, model.lm_head.weight, atol=0, rtol=0)


def test_saving_does_not_import_deepspeed(tiny_model_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    code = (
        "import sys, pathlib, torch, transformers\n"
        "from plrl_workers.engines import training\n"
        f"m = transformers.AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r})\n"
        f"training.save_hf_model(m, pathlib.Path({str(tmp_path / 'out')!r}))\n"
        "print('deepspeed' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert out.stdout.strip() == "False"
