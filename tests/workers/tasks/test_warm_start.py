"""The SFT warm start gives a fresh tiny model a non-zero reward, deterministically and reusably.

Cases: a short warm start lifts the greedy reward on held-out prompts from ~0 to clearly above 0
(and it learns to stop: answers end in EOS); the saved directory loads as an ordinary Hugging Face
model with its tokenizer; the same inputs give bit-identical weights and a second `run` reuses the
directory; zero steps copies the model unchanged.
"""

from __future__ import annotations

import collections.abc
import pathlib
from typing import Any

import pytest

from plrl_workers.models import tiny
from plrl_workers.tasks import base, evaluate, registry, rewards, warm_start


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> collections.abc.Iterator[None]:
    # The model is tiny: on 2 shared cores one thread is much faster than two spinning ones.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir(one_thread: None, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tiny.build(tmp_path_factory.mktemp("tiny"), seed=0)


def _load(d: pathlib.Path) -> tuple[Any, Any]:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    return model, tok


def test_warm_start_raises_held_out_reward_from_zero(model_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    task = registry.builtin("reverse")  # the demo's task
    held_out = base.take(task, seed=0, n=64, split="eval")
    reward = rewards.load(task.default_reward)

    model, tok = _load(model_dir)
    before = evaluate.evaluate(model, tok, held_out, reward, max_new_tokens=10)
    cfg = warm_start.WarmStartConfig(steps=60, batch_size=32, seed=0)
    out = warm_start.run(model_dir, tmp_path / "warm", task, cfg)
    model, tok = _load(out)
    after = evaluate.evaluate(model, tok, held_out, reward, max_new_tokens=10)

    assert before.mean_reward < 0.05, before
    assert after.mean_reward > 0.3, after
    prompts = [base.prompt_token_ids(tok, it.text) for it in held_out[:16]]
    completions = evaluate.sample(
        model, prompts, max_new_tokens=10, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    assert sum(c[-1:] == [tok.eos_token_id] for c in completions) >= 12  # it learned where answers end


def test_same_inputs_same_weights_and_reuse(model_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    import safetensors.torch

    task = registry.builtin("arith")
    cfg = warm_start.WarmStartConfig(steps=3, batch_size=8, seed=5)
    a = warm_start.run(model_dir, tmp_path / "a", task, cfg)
    b = warm_start.run(model_dir, tmp_path / "b", task, cfg)
    wa = safetensors.torch.load_file(str(a / "model.safetensors"))
    wb = safetensors.torch.load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    w0 = safetensors.torch.load_file(str(model_dir / "model.safetensors"))
    assert any((wa[k] != w0[k]).any() for k in wa)

    stamp = (a / warm_start.STAMP).stat().st_mtime_ns
    assert warm_start.run(model_dir, tmp_path / "a", task, cfg) == a
    assert (a / warm_start.STAMP).stat().st_mtime_ns == stamp
    other = warm_start.WarmStartConfig(steps=3, batch_size=8, seed=6)
    warm_start.run(model_dir, tmp_path / "a", task, other)  # different inputs: redone in place
    assert (a / warm_start.STAMP).stat().st_mtime_ns != stamp


def test_zero_steps_copies_the_model(model_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    import safetensors.torch

    out = warm_start.run(
        model_dir, tmp_path / "copy", registry.builtin("arith"), warm_start.WarmStartConfig(steps=0)
    )
    w0 = safetensors.torch.load_file(str(model_dir / "model.safetensors"))
    w1 = safetensors.torch.load_file(str(out / "model.safetensors"))
    assert all((w0[k] == w1[k]).all() for k in w0)
    assert (out / "tokenizer.json").exists()
