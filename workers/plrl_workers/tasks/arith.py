"""`builtin:arith`: addition of two numbers below 100, e.g. `47+38=` -> `85`.

Harder for the tiny model than `builtin:reverse` (the demo's task): the tens digit needs the carry
from the units, an algorithm rather than a copy pattern. SFT learns it (about 60% of held-out sums
exact after 1000 steps of 32). RL needs a gentler learning rate than `reverse` (1.5e-4): 3e-4 and 1e-3
unlearn the warm start. `examples/local-arith.yaml` is the recipe that learns: 500 warm-start
steps, lr 1e-4, 600 steps (BENCHMARKS.md). It is also the spec's default task name.

Items are pure functions of `(seed, split, prompt_id)`; about 10% of the 10^4 problems are held
out as the `eval` split (`base.is_held_out`). Neighbours: `tasks/base.py`, `tasks/rewards.py`.
"""

from __future__ import annotations

import dataclasses
import random

from plrl_workers.tasks import base


@dataclasses.dataclass(frozen=True)
class ArithTask:
    """`a+b=` -> `a+b` in decimal, with 0 <= a, b <= max_operand."""

    max_operand: int = 99

    @property
    def name(self) -> str:
        return "arith"

    @property
    def default_reward(self) -> str:
        return "builtin:digit_match"

    def item(self, seed: int, prompt_id: int, split: base.Split = "train") -> base.Item:
        return base.draw_item(self.name, seed, split, prompt_id, self._draw)

    def _draw(self, rng: random.Random) -> tuple[str, str, str]:
        a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        return f"{a}+{b}", f"{a}+{b}=", str(a + b)
