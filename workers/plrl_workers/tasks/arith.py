"""The built-in tasks: two-digit addition (`builtin:arith`, the demo's) and digit reversal.

Both are pure functions of `(seed, split, prompt_id)`: each item is drawn from its own RNG seeded
by those three values, so any prompt can be regenerated anywhere without replaying the stream.
The problem space is split once, by a hash of the problem itself (not of the seed), into a train
part and a held-out ~10% `eval` part, so evaluation never sees a problem the model trained on.

Why addition of two numbers below 100: a ~0.5M-parameter model cannot memorise the 10^4 problems
in a short warm start, so it has to learn carrying digit by digit; a few hundred SFT steps leave
it partially right (the tens digit and carries are the hard part), which is the regime where
REINFORCE has a signal. Answers are 1-3 characters, so a sample is at most 4 decode steps.

Neighbours: `tasks/base.py` (the `Task` protocol, the registry), `tasks/rewards.py` (scoring).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random

from plrl_workers.tasks import base

# About this fraction of the problem space is held out as the `eval` split.
EVAL_FRACTION = 0.1


def _held_out(key: str) -> bool:
    """Whether a problem belongs to the eval split; a property of the problem, not of any seed."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "big") < EVAL_FRACTION * 2**32


def _rng(name: str, seed: int, split: base.Split, prompt_id: int) -> random.Random:
    if prompt_id < 0:
        raise ValueError(f"prompt_id must be >= 0, got {prompt_id}")
    # A str seed is hashed with SHA-512 by `random`, so this is stable across processes and runs.
    return random.Random(f"{name}:{seed}:{split}:{prompt_id}")


@dataclasses.dataclass(frozen=True)
class ArithTask:
    """`a+b=` -> `c` with 0 <= a, b <= max_operand, e.g. `47+38=` -> `85`."""

    max_operand: int = 99

    @property
    def name(self) -> str:
        return "arith"

    @property
    def default_reward(self) -> str:
        return "builtin:digit_match"

    def item(self, seed: int, prompt_id: int, split: base.Split = "train") -> base.Item:
        rng = _rng(self.name, seed, split, prompt_id)
        while True:
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            if _held_out(f"{a}+{b}") == (split == "eval"):
                return base.Item(prompt_id=prompt_id, text=f"{a}+{b}=", answer=str(a + b))


@dataclasses.dataclass(frozen=True)
class ReverseTask:
    """`<digits>` reversed, e.g. `rev 40721=` -> `12704`; lengths min_len..max_len."""

    min_len: int = 3
    max_len: int = 7

    @property
    def name(self) -> str:
        return "reverse"

    @property
    def default_reward(self) -> str:
        return "builtin:digit_match"

    def item(self, seed: int, prompt_id: int, split: base.Split = "train") -> base.Item:
        rng = _rng(self.name, seed, split, prompt_id)
        while True:
            n = rng.randint(self.min_len, self.max_len)
            digits = "".join(rng.choice("0123456789") for _ in range(n))
            if _held_out(f"rev:{digits}") == (split == "eval"):
                return base.Item(prompt_id=prompt_id, text=f"rev {digits}=", answer=digits[::-1])
