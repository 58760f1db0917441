"""Supervised warm start (`model.warmStartSteps`): teach a fresh tiny model the task's answer format.

A randomly initialised model almost never emits a correct answer, so RL would see all-zero
rewards and no gradient. A few hundred steps of cross-entropy on the task's own reference
answers (loss on the answer and EOS only) make it partially competent; RL takes it from there.
The result is saved as an ordinary Hugging Face directory and stamped with a fingerprint of its
inputs, so running it again with the same inputs reuses the directory. Everything is seeded:
same inputs, same thread count, same weights.

Neighbours: `models/tiny.py` (builds the initial directory), `tasks/base.py` (the items and how a
prompt is tokenised), `tasks/evaluate.py` (measures what the warm start achieved), `plrl run`
(calls `run` before starting any worker).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING

from plrl_workers.engines import training
from plrl_workers.tasks import base

if TYPE_CHECKING:
    import torch
    import transformers

STAMP = "plrl-warm-start.json"


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """How long and how hard to train. The defaults suit the built-in tiny model."""

    steps: int
    batch_size: int = 32
    learning_rate: float = 1e-3
    seed: int = 0  # weight init is the model's; this seeds the data order

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.learning_rate <= 0:
            raise ValueError(f"invalid warm start config {self}")


def sft_batch(
    tokenizer: transformers.PreTrainedTokenizerBase, items: Sequence[base.Item]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels): BOS + prompt + answer + EOS, right-padded.

    Labels are -100 on the prompt and the padding, so only the answer and EOS are learned; the
    prompt is tokenised by `base.prompt_token_ids` exactly as the generators will tokenise it.
    """
    import torch

    rows: list[tuple[list[int], list[int]]] = []
    for it in items:
        prompt = list(base.prompt_token_ids(tokenizer, it.text))
        answer = [*tokenizer(it.answer, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
        rows.append((prompt + answer, [-100] * len(prompt) + answer))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows], dtype=torch.long)
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows], dtype=torch.long)
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows], dtype=torch.long)
    return input_ids, mask, labels


def train(
    model: transformers.PreTrainedModel,
    tokenizer: transformers.PreTrainedTokenizerBase,
    task: base.Task,
    cfg: WarmStartConfig,
) -> list[float]:
    """Train `model` in place for `cfg.steps` AdamW steps; return the loss of every step."""
    import torch

    torch.manual_seed(cfg.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    losses: list[float] = []
    items = base.stream(task, cfg.seed, "train")
    for _ in range(cfg.steps):
        batch = [next(items) for _ in range(cfg.batch_size)]
        input_ids, mask, labels = sft_batch(tokenizer, batch)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def _fingerprint(model_dir: pathlib.Path, task: base.Task, cfg: WarmStartConfig) -> str:
    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")):
        h.update(f.read_bytes())
    h.update(json.dumps({"task": repr(task), "cfg": dataclasses.asdict(cfg)}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def run(
    model_dir: str | pathlib.Path, out_dir: str | pathlib.Path, task: base.Task, cfg: WarmStartConfig
) -> pathlib.Path:
    """Warm-start the model in `model_dir` and save it (with its tokenizer) to `out_dir`.

    Reuses `out_dir` when it already holds the result for the same inputs. With `cfg.steps == 0`
    the model is copied unchanged, so callers can always load from `out_dir`.
    """
    import torch
    import transformers

    src, out = pathlib.Path(model_dir), pathlib.Path(out_dir)
    fp = _fingerprint(src, task, cfg)
    stamp = out / STAMP
    if stamp.exists() and json.loads(stamp.read_text()).get("fingerprint") == fp:
        return out
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(src))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    losses = train(model, tokenizer, task, cfg)
    # Write beside the target and rename, so a crash never leaves a half-written model behind.
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    training.save_hf_model(model, tmp)  # not save_pretrained: it imports DeepSpeed (seconds)
    tokenizer.save_pretrained(str(tmp))
    for extra in src.glob("plrl-*.json"):
        shutil.copy(extra, tmp / extra.name)
    summary = {
        "fingerprint": fp,
        "task": task.name,
        "config": dataclasses.asdict(cfg),
        "final_loss": losses[-1] if losses else None,
    }
    (tmp / STAMP).write_text(json.dumps(summary))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
