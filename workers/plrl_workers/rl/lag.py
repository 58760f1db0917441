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

Then the staleness mix (`training.loss.staleWeight`, s in (0, 1], 1 = off; the seed's "mix delayed
and current gradients 1 : 0.3" is s = 0.3): among the batch's kept samples, those at the smallest
lag in the batch are its fresh ones, every other kept sample is stale and its weight is multiplied
by s. The gradient is then sum(fresh terms) + s * sum(stale terms) over the same normaliser N: a
1 : s mix of the two parts. Relative to the freshest data present, not to lag 0: in a pipeline
nearly every sample has lag >= 1, and scaling a whole batch by s does nothing under Adam (it is
invariant to the gradient's scale). Counted in `samples_stale`.

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
    samples_stale: int = 0
    """Kept samples the staleness mix weighted by staleWeight (0 when it is off)."""

    def as_metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}


def mix_stale(
    weights: list[list[float | None]], lags: list[list[int]], stale_weight: float
) -> tuple[list[list[float | None]], int]:
    """The staleness mix: kept samples above the batch's smallest kept lag get `stale_weight` times
    their weight. Returns the new weights and how many samples were stale."""
    if not 0.0 < stale_weight <= 1.0:
        raise ValueError(f"training.loss.staleWeight={stale_weight} must be in (0, 1]")
    kept = [
        lag
        for row, lrow in zip(weights, lags, strict=True)
        for w, lag in zip(row, lrow, strict=True)
        if w is not None
    ]
    if stale_weight == 1.0 or not kept:
        return weights, 0
    fresh = min(kept)
    out = [
        [
            None if w is None else (w * stale_weight if lag > fresh else w)
            for w, lag in zip(row, lrow, strict=True)
        ]
        for row, lrow in zip(weights, lags, strict=True)
    ]
    return out, sum(lag > fresh for lag in kept)


def apply(
    groups: Sequence[protocol.RolloutGroup],
    trainer_version: int,
    max_lag: int,
    policy: str,
    stale_weight: float = 1.0,
) -> tuple[list[list[float | None]], LagStats]:
    """Per-sample weights (None = dropped), nested like `groups[i].samples`, and the counts."""
    weights: list[list[float | None]] = []
    lags: list[list[int]] = []
    samples = dropped = downweighted = groups_dropped = tokens = lag_sum = lag_max = multi = 0
    for group in groups:
        row: list[float | None] = []
        lags.append([])
        for s in group.samples:
            lag = sample_lag(s.versions, trainer_version)
            w = weight_for(lag, max_lag, policy)
            row.append(w)
            lags[-1].append(lag)
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
    weights, stale = mix_stale(weights, lags, stale_weight)
    stats = LagStats(
        samples=samples,
        samples_dropped=dropped,
        samples_downweighted=downweighted,
        groups_dropped=groups_dropped,
        tokens=tokens,
        token_lag_mean=lag_sum / tokens if tokens else 0.0,
        token_lag_max=lag_max,
        multi_version_samples=multi,
        samples_stale=stale,
    )
    return weights, stats
