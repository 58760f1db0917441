"""Per-sample advantages from a prompt's group of G rewards (leave-one-out baseline).

Each sample's advantage is its reward minus the mean reward of the *other* G-1 samples of the same
prompt, which keeps the baseline independent of the sample it is subtracted from (an unbiased
REINFORCE baseline). Algebraically A_i = G/(G-1) * (r_i - mean(r)). With `normalize` (spec
`training.loss.normalizeAdvantages`) the advantages are divided by the group's reward standard
deviation (unbiased, ddof=1, plus `STD_EPS`), as GRPO/TRL do.

A group whose rewards are all equal (within `ZERO_TOL`) has zero advantage for every sample: it
carries no policy-gradient signal. It is detected and counted, not removed here; the trainer keeps
it (its tokens still count in the per-token loss normaliser, see `rl/losses.py`).

Pure Python (no torch). Neighbours: `rl/lag.py` (decides which groups are kept and their weights),
`rl/step.py` (turns groups into packed training sequences).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from plrl_workers import protocol

STD_EPS = 1e-4
"""Added to the group std before dividing, so near-constant groups do not explode (TRL's value)."""
ZERO_TOL = 1e-9
"""Groups whose reward range is at most this are zero-advantage groups."""


def is_zero_advantage(rewards: Sequence[float]) -> bool:
    """True when every advantage of the group is zero (all rewards equal, or a single sample)."""
    return len(rewards) < 2 or max(rewards) - min(rewards) <= ZERO_TOL


def leave_one_out(rewards: Sequence[float], normalize: bool = False) -> list[float]:
    """A_i = r_i - mean_{j != i} r_j, optionally divided by the group's reward std.

    A group of one sample has no baseline; its advantage is 0 (it teaches nothing).
    """
    g = len(rewards)
    if g == 0:
        return []
    if not all(math.isfinite(r) for r in rewards):
        raise ValueError(f"rewards must be finite, got {list(rewards)}")
    if is_zero_advantage(rewards):
        return [0.0] * g
    total = math.fsum(rewards)
    adv = [r - (total - r) / (g - 1) for r in rewards]
    if normalize:
        mean = total / g
        std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (g - 1))
        adv = [a / (std + STD_EPS) for a in adv]
    return adv


@dataclasses.dataclass(frozen=True)
class AdvantageStats:
    """What the trainer logs about one optimizer batch's groups."""

    groups: int
    samples: int
    zero_advantage_groups: int
    reward_mean: float
    advantage_abs_mean: float

    def as_metrics(self) -> dict[str, float]:
        return {
            "groups": float(self.groups),
            "zero_advantage_groups": float(self.zero_advantage_groups),
            "zero_advantage_frac": self.zero_advantage_groups / self.groups if self.groups else 0.0,
            "reward_mean": self.reward_mean,
            "advantage_abs_mean": self.advantage_abs_mean,
        }


def compute(
    groups: Sequence[protocol.RolloutGroup], normalize: bool = False
) -> tuple[list[list[float]], AdvantageStats]:
    """Advantages for every sample of every group (same nesting as `groups[i].samples`)."""
    out: list[list[float]] = []
    zero = 0
    rewards_all: list[float] = []
    for group in groups:
        rewards = [s.reward for s in group.samples]
        rewards_all.extend(rewards)
        zero += is_zero_advantage(rewards)
        out.append(leave_one_out(rewards, normalize))
    flat = [a for adv in out for a in adv]
    stats = AdvantageStats(
        groups=len(groups),
        samples=len(flat),
        zero_advantage_groups=zero,
        reward_mean=math.fsum(rewards_all) / len(rewards_all) if rewards_all else 0.0,
        advantage_abs_mean=math.fsum(abs(a) for a in flat) / len(flat) if flat else 0.0,
    )
    return out, stats
