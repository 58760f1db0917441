"""Decode a batch of prompts with a transformers model and score it against a task (no engine).

For the warm start's checks, tests and `bench/`: it uses transformers `generate`, one call per
prompt length so no padding is ever needed (padding would make a tiny model's positions and
masks a second thing to get right). The runtime's generators use `engines/` instead.

Neighbours: `tasks/base.py` (tokenising prompts), `tasks/rewards.py` (scoring),
`tasks/warm_start.py` (reports the reward before and after).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from plrl_workers.tasks import base, rewards

if TYPE_CHECKING:
    import torch
    import transformers


def sample(
    model: transformers.PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float | None = None,
    generator_seed: int | None = None,
) -> list[list[int]]:
    """Completion token ids per prompt, cut after the first EOS (which is kept).

    `temperature=None` decodes greedily. Sampling draws from torch's global RNG, seeded here from
    `generator_seed` when given, so a seeded call is reproducible.
    """
    import torch

    if generator_seed is not None:
        torch.manual_seed(generator_seed)
    by_len: dict[int, list[int]] = collections.defaultdict(list)
    for i, p in enumerate(prompts):
        by_len[len(p)].append(i)
    out: list[list[int]] = [[] for _ in prompts]
    with torch.no_grad():
        for length in sorted(by_len):
            idx = by_len[length]
            ids = torch.tensor([list(prompts[i]) for i in idx], dtype=torch.long)
            kwargs: dict[str, object] = {"do_sample": False}
            if temperature is not None:
                kwargs = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
            gen: torch.Tensor = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                eos_token_id=eos_token_id,
                pad_token_id=pad_token_id,
                **kwargs,
            )
            for row, i in zip(gen[:, length:].tolist(), idx, strict=True):
                out[i] = row[: row.index(eos_token_id) + 1] if eos_token_id in row else row
    return out


@dataclasses.dataclass(frozen=True)
class EvalResult:
    mean_reward: float
    exact: float  # fraction of completions equal to the answer
    n: int


def evaluate(
    model: transformers.PreTrainedModel,
    tokenizer: transformers.PreTrainedTokenizerBase,
    items: Sequence[base.Item],
    reward: rewards.RewardFn,
    *,
    max_new_tokens: int,
    temperature: float | None = None,
    generator_seed: int | None = None,
) -> EvalResult:
    """Mean reward and exact-match rate of the model's completions of `items` (greedy by default)."""
    prompts = [base.prompt_token_ids(tokenizer, it.text) for it in items]
    completions = sample(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        temperature=temperature,
        generator_seed=generator_seed,
    )
    texts = [base.completion_text(tokenizer, c) for c in completions]
    scores = [rewards.score(reward, it.text, t, it.answer) for it, t in zip(items, texts, strict=True)]
    exact = [rewards.exact_match(it.text, t, it.answer) for it, t in zip(items, texts, strict=True)]
    n = max(len(items), 1)
    return EvalResult(mean_reward=sum(scores) / n, exact=sum(exact) / n, n=len(items))
