"""`builtin:reverse`, the demo's task: write a digit string backwards, e.g. `rev 40721=` -> `12704`.

Why this task for `make demo`: it is a structural skill (attend to the mirrored position), so
what REINFORCE learns on one prompt carries over to all of them, and `builtin:digit_match` gives
per-position partial credit, a dense signal. An SFT warm start (`model.warmStartSteps`; the demo
uses 150) leaves the tiny model partially right, and RL then climbs steadily; see
`bench/task_learnability.py` for the curves. Strings of 3-7 digits keep a sample at most 8
decode steps (7 digits + EOS), so 2 CPU cores run hundreds of RL steps in minutes.

Items are pure functions of `(seed, split, prompt_id)`; about 10% of the digit strings are held
out as the `eval` split (`base.is_held_out`). Neighbours: `tasks/base.py`, `tasks/rewards.py`.
"""

from __future__ import annotations

import dataclasses
import random

from plrl_workers.tasks import base


@dataclasses.dataclass(frozen=True)
class ReverseTask:
    """`rev <digits>=` -> the digits reversed; min_len..max_len digits, leading zeros allowed."""

    min_len: int = 3
    max_len: int = 7

    @property
    def name(self) -> str:
        return "reverse"

    @property
    def default_reward(self) -> str:
        return "builtin:digit_match"

    def item(self, seed: int, prompt_id: int, split: base.Split = "train") -> base.Item:
        return base.draw_item(self.name, seed, split, prompt_id, self._draw)

    def _draw(self, rng: random.Random) -> tuple[str, str, str]:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(self.min_len, self.max_len)))
        return f"rev:{digits}", f"rev {digits}=", digits[::-1]
