"""The max-lag policy: per-token lag in optimizer steps, samples judged by their oldest token,
`drop` (counted per sample and per fully dropped prompt) and `downweight` (halving per extra step);
the staleness mix (`staleWeight`) on top of it."""

from __future__ import annotations

import pytest

from plrl_workers import protocol
from plrl_workers.rl import lag


def _sample(versions: list[int]) -> protocol.Sample:
    return protocol.Sample(list(range(len(versions))), [-1.0] * len(versions), versions, 1.0, "stop")


def _group(prompt_id: int, *version_lists: list[int]) -> protocol.RolloutGroup:
    return protocol.RolloutGroup(f"l{prompt_id}", prompt_id, [1], [_sample(v) for v in version_lists], "g")


def test_a_samples_lag_is_that_of_its_oldest_token() -> None:
    assert lag.sample_lag([7, 8, 9], trainer_version=10) == 3
    assert lag.sample_lag([], trainer_version=10) == 0
    with pytest.raises(ValueError, match="newer than the trainer"):
        lag.weight_for(-1, 4, lag.DROP)


def test_drop_removes_samples_beyond_max_lag_and_counts_them() -> None:
    groups = [
        _group(0, [10, 10], [10, 11]),  # lags 2 and 2 at version 12: kept
        _group(1, [8, 12], [9, 9]),  # lag 4 (dropped) and 3 (kept)
        _group(2, [5], [6, 7]),  # both beyond: the prompt is dropped
    ]
    weights, stats = lag.apply(groups, trainer_version=12, max_lag=3, policy=lag.DROP)
    assert weights == [[1.0, 1.0], [None, 1.0], [None, None]]
    assert (stats.samples, stats.samples_dropped, stats.groups_dropped) == (6, 3, 1)
    assert stats.samples_downweighted == 0
    assert stats.token_lag_max == 7
    assert stats.tokens == 11
    assert stats.token_lag_mean == pytest.approx(sum([2, 2, 2, 1, 4, 0, 3, 3, 7, 6, 5]) / 11)
    assert stats.multi_version_samples == 3


def test_downweight_halves_per_step_beyond_the_bound_and_keeps_everything() -> None:
    groups = [_group(0, [10], [9], [7])]
    weights, stats = lag.apply(groups, trainer_version=12, max_lag=3, policy=lag.DOWNWEIGHT)
    assert weights == [[1.0, 1.0, 0.25]]
    assert (stats.samples_dropped, stats.samples_downweighted, stats.groups_dropped) == (0, 1, 0)


def test_max_lag_zero_is_strictly_on_policy() -> None:
    weights, _ = lag.apply([_group(0, [5, 5], [4, 5])], trainer_version=5, max_lag=0, policy=lag.DROP)
    assert weights == [[1.0, None]]


def test_unknown_policy_names_the_field() -> None:
    with pytest.raises(ValueError, match="lagPolicy"):
        lag.weight_for(5, 1, "ignore")


def test_the_staleness_mix_weights_samples_older_than_the_batchs_freshest_by_stale_weight() -> None:
    groups = [
        _group(0, [11, 11], [10, 11]),  # lags 1 (fresh: the smallest kept) and 2 (stale)
        _group(1, [9], [5]),  # lag 3 (stale) and 7 (dropped: never counted as stale)
    ]
    weights, stats = lag.apply(groups, trainer_version=12, max_lag=3, policy=lag.DROP, stale_weight=0.3)
    assert weights == [[1.0, 0.3], [0.3, None]]
    assert (stats.samples_stale, stats.samples_dropped) == (2, 1)
    # Multiplies the lag policy's own weight; 1 leaves every weight as the policy set it.
    weights, _ = lag.apply(groups, trainer_version=12, max_lag=2, policy=lag.DOWNWEIGHT, stale_weight=0.5)
    assert weights == [[1.0, 0.5], [0.25, 0.5**5 * 0.5]]
    same, stats = lag.apply(groups, trainer_version=12, max_lag=3, policy=lag.DROP, stale_weight=1.0)
    assert same == [[1.0, 1.0], [1.0, None]] and stats.samples_stale == 0


def test_a_batch_at_one_lag_has_no_stale_samples() -> None:
    weights, stats = lag.apply(
        [_group(0, [10], [10, 11])], trainer_version=12, max_lag=3, policy=lag.DROP, stale_weight=0.3
    )
    assert weights == [[1.0, 1.0]] and stats.samples_stale == 0


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.01])
def test_a_stale_weight_out_of_range_names_the_field(bad: float) -> None:
    with pytest.raises(ValueError, match="staleWeight"):
        lag.apply([_group(0, [10])], trainer_version=12, max_lag=3, policy=lag.DROP, stale_weight=bad)
