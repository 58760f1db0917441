"""Lag in optimizer steps, and the spec's max-lag policy (`pipeline.maxLag`, `pipeline.lagPolicy`).

A token's lag is `trainer_version - token_version`: how many optimizer steps the weights that are
about to be differentiated are ahead of the weights that sampled the token (0 = on-policy). A
sample's lag is the lag of its *oldest* token. The policy is applied per sample, when the trainer
builds the optimizer batch that will consume it:

- `drop`: a sample with lag > maxLag is not trained; it is counted in `samples_dropped`. A group
  (prompt) all of whose samples are dropped counts in `groups_dropped`: that prompt is accounted as
  dropped by the lag policy, every other prompt as trained.
- `downweight`: a sample with lag > maxLag is trained with weight `0.5 ** (lag - maxLag)`: it halves
  for every step beyond the bound (continuous at the bound, weight 1 there). The weight multiplies
  the sample's per-token loss terms; the loss normaliser (token count) is unchanged, so a
  down-weighted sample really contributes less. Counted in `samples_downweighted`.

The remaining samples keep their leave-one-out advantages computed from all G rewards: the
baseline of sample i uses only the other samples' rewards, so it stays independent of sample i
when some of them are dropped.

Pure (numpy over each sample's `versions`). Neighbours: `rl/advantages.py`, `rl/step.py` (builds
training sequences from the kept samples), `rl/packing.py` (carries per-token versions so the step
reports the lag it trained).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy
import numpy.typing as npt

from plrl_workers import protocol

DROP = "drop"
DOWNWEIGHT = "downweight"


def sample_lag(versions: npt.ArrayLike, trainer_version: int) -> int:
    """Lag of the sample's oldest token (0 for an empty completion)."""
    v = numpy.asarray(versions)
    return trainer_version - int(v.min()) if v.size else 0


def weight_for(lag: int, max_lag: int, policy: str) -> float | None:
    """The sample's loss weight under the policy, or None when it is dropped."""
    if lag < 0:
        raise ValueError(f"lag={lag} is negative: a token claims a weight version newer than the trainer's")
    if lag <= max_lag:
        return 1.0
    if policy == DROP:
        return None
    if policy == DOWNWEIGHT:
        return float(0.5 ** (lag - max_lag))
    raise ValueError(f"pipeline.lagPolicy={policy!r} must be {DROP!r} or {DOWNWEIGHT!r}")


@dataclasses.dataclass(frozen=True)
class LagStats:
    """Counts and lag statistics of one optimizer batch, as received (before the policy)."""

    samples: int
    samples_dropped: int
    samples_downweighted: int
    groups_dropped: int
    tokens: int
    token_lag_mean: float
    token_lag_max: int
    multi_version_samples: int
    """Samples whose tokens come from two or more weight versions (updates happened in flight)."""

    def as_metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}


def apply(
    groups: Sequence[protocol.RolloutGroup], trainer_version: int, max_lag: int, policy: str
) -> tuple[list[list[float | None]], LagStats]:
    """Per-sample weights (None = dropped), nested like `groups[i].samples`, and the counts."""
    weights: list[list[float | None]] = []
    samples = dropped = downweighted = groups_dropped = tokens = lag_sum = lag_max = multi = 0
    for group in groups:
        row: list[float | None] = []
        for s in group.samples:
            lag = sample_lag(s.versions, trainer_version)
            w = weight_for(lag, max_lag, policy)
            row.append(w)
            samples += 1
            dropped += w is None
            downweighted += w is not None and w < 1.0
            n = len(s.versions)
            if n:
                multi += bool((s.versions != s.versions[0]).any())
                lag_sum += trainer_version * n - int(s.versions.sum(dtype=numpy.int64))
                lag_max = max(lag_max, lag)
            tokens += n
        groups_dropped += bool(row) and all(w is None for w in row)
        weights.append(row)
    stats = LagStats(
        samples=samples,
        samples_dropped=dropped,
        samples_downweighted=downweighted,
        groups_dropped=groups_dropped,
        tokens=tokens,
        token_lag_mean=lag_sum / tokens if tokens else 0.0,
        token_lag_max=lag_max,
        multi_version_samples=multi,
    )
    return weights, stats
