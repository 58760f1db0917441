"""What a task is: a deterministic, random-access prompt stream (the registry says which exist).

A task maps `(seed, split, prompt_id)` to one `Item`: the rendered prompt text and its reference
answer. Being a pure function of the id (not of a stateful iterator) is what lets the coordinator
re-lease a prompt after a generator dies and resume after a restart without replaying the stream.

Neighbours: `tasks/registry.py` (task names -> tasks), `tasks/reverse.py`, `tasks/arith.py` (the
built-in tasks), `tasks/jsonl.py` (user datasets),
`tasks/rewards.py` (how completions are scored), `tasks/warm_start.py` (SFT on `Item.answer`),
the coordinator (consumes `to_prompts`), `plrl_api.spec.TaskSpec` (what a user writes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal, Protocol

from plrl_workers import protocol

if TYPE_CHECKING:
    import transformers

Split = Literal["train", "eval"]


@dataclasses.dataclass(frozen=True)
class Item:
    """One task prompt: `text` is exactly what the model sees (before BOS), `answer` the reference."""

    prompt_id: int
    text: str
    answer: str


class Task(Protocol):
    """A source of prompts. `item` must be a pure function of its arguments."""

    @property
    def name(self) -> str:
        """Short name used in logs and run directories (`arith`, `jsonl:<file>`)."""
        ...

    @property
    def default_reward(self) -> str:
        """The reward (`builtin:<name>` or `pkg.module:function`) this task is meant to be scored with."""
        ...

    def item(self, seed: int, prompt_id: int, split: Split = "train") -> Item:
        """The prompt numbered `prompt_id` (>= 0) of the stream for `seed` and `split`."""
        ...


class TaskError(ValueError):
    """A task that cannot be used; the message names the spec field (`task.name`, `task.dataset`)."""


# About this fraction of a builtin task's problem space is held out as its `eval` split.
EVAL_FRACTION = 0.1


def is_held_out(problem: str) -> bool:
    """Whether a builtin problem belongs to the eval split: a property of the problem, not of a seed."""
    digest = hashlib.sha256(problem.encode()).digest()
    return int.from_bytes(digest[:4], "big") < EVAL_FRACTION * 2**32


def item_rng(task_name: str, seed: int, split: Split, prompt_id: int) -> random.Random:
    """The RNG that draws one builtin item: a function of its coordinates only (random access)."""
    if prompt_id < 0:
        raise ValueError(f"prompt_id must be >= 0, got {prompt_id}")
    # A str seed is hashed with SHA-512 by `random`, so this is stable across processes and runs.
    return random.Random(f"{task_name}:{seed}:{split}:{prompt_id}")


def draw_item(
    task_name: str,
    seed: int,
    split: Split,
    prompt_id: int,
    draw: Callable[[random.Random], tuple[str, str, str]],
) -> Item:
    """A builtin item of `split`: `draw(rng)` -> (problem key, prompt text, answer), redrawn until
    the problem belongs to the split (`is_held_out`), so train and eval never share a problem."""
    rng = item_rng(task_name, seed, split, prompt_id)
    while True:
        problem, text, answer = draw(rng)
        if is_held_out(problem) == (split == "eval"):
            return Item(prompt_id=prompt_id, text=text, answer=answer)


def stream(task: Task, seed: int, split: Split = "train", start: int = 0) -> Iterator[Item]:
    """The endless prompt stream from `start` on (prompt ids `start`, `start + 1`, ...)."""
    for i in itertools.count(start):
        yield task.item(seed, i, split)


def take(task: Task, seed: int, n: int, split: Split = "train", start: int = 0) -> list[Item]:
    """The first `n` items of the stream from `start`."""
    return list(itertools.islice(stream(task, seed, split, start), n))


def prompt_token_ids(tokenizer: transformers.PreTrainedTokenizerBase, text: str) -> tuple[int, ...]:
    """BOS + the prompt's tokens: the one place that decides how a prompt is tokenised.

    Warm start, generators and evaluation all go through here, so the model always sees the
    prompt the same way it was taught.
    """
    ids = tokenizer(text, add_special_tokens=False).input_ids
    bos = tokenizer.bos_token_id
    return tuple(([bos] if bos is not None else []) + list(ids))


def to_prompt(item: Item, tokenizer: transformers.PreTrainedTokenizerBase) -> protocol.Prompt:
    """An `Item` as the coordinator leases it: with token ids."""
    return protocol.Prompt(
        prompt_id=item.prompt_id,
        text=item.text,
        answer=item.answer,
        token_ids=prompt_token_ids(tokenizer, item.text),
    )


def to_prompts(
    task: Task,
    tokenizer: transformers.PreTrainedTokenizerBase,
    seed: int,
    split: Split = "train",
    start: int = 0,
) -> Iterator[protocol.Prompt]:
    """The endless stream of leasable prompts from `start` on."""
    for item in stream(task, seed, split, start):
        yield to_prompt(item, tokenizer)


def completion_text(tokenizer: transformers.PreTrainedTokenizerBase, token_ids: list[int]) -> str:
    """What a reward function sees: the completion's text without EOS/padding."""
    text: str = tokenizer.decode(token_ids, skip_special_tokens=True)
    return text
