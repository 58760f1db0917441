"""Leave-one-out advantages: values, the baseline's independence from the sample, optional std
normalisation, zero-advantage groups (all rewards equal, single sample) detected and counted."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plrl_workers import protocol
from plrl_workers.rl import advantages

rewards_lists = st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=16)


def _group(prompt_id: int, rewards: list[float]) -> protocol.RolloutGroup:
    samples = [protocol.Sample([1], [-0.5], [0], r, "stop") for r in rewards]
    return protocol.RolloutGroup(f"l{prompt_id}", prompt_id, [3, 4], samples, "gen-0")


def test_each_sample_is_compared_with_the_mean_of_the_others() -> None:
    adv = advantages.leave_one_out([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert advantages.leave_one_out([3.0, 1.0]) == pytest.approx([2.0, -2.0])


@given(rewards_lists)
def test_advantages_sum_to_zero_and_scale_the_centred_rewards(rewards: list[float]) -> None:
    adv = advantages.leave_one_out(rewards)
    g, mean = len(rewards), sum(rewards) / len(rewards)
    if advantages.is_zero_advantage(rewards):
        assert adv == [0.0] * g
    else:
        assert adv == pytest.approx([g / (g - 1) * (r - mean) for r in rewards], abs=1e-9)
    assert math.fsum(adv) == pytest.approx(0.0, abs=1e-9)


@given(rewards_lists, st.floats(-10, 10, allow_nan=False))
def test_a_samples_baseline_does_not_depend_on_its_own_reward(rewards: list[float], new: float) -> None:
    changed = [new, *rewards[1:]]
    a, b = advantages.leave_one_out(rewards), advantages.leave_one_out(changed)
    if advantages.is_zero_advantage(rewards) or advantages.is_zero_advantage(changed):
        return
    # baseline_0 = r_0 - A_0 is the mean of the others, unchanged when r_0 changes.
    assert rewards[0] - a[0] == pytest.approx(changed[0] - b[0], abs=1e-9)


def test_normalisation_divides_by_the_groups_unbiased_std() -> None:
    adv = advantages.leave_one_out([0.0, 1.0], normalize=True)
    std = math.sqrt(0.5)  # ddof=1
    assert adv == pytest.approx([-1.0 / (std + advantages.STD_EPS), 1.0 / (std + advantages.STD_EPS)])
    # A group of many equal rewards plus one outlier stays bounded when normalised.
    assert max(abs(a) for a in advantages.leave_one_out([0.0] * 15 + [1.0], normalize=True)) < 5


def test_zero_advantage_groups_are_zero_and_counted() -> None:
    assert advantages.leave_one_out([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert advantages.leave_one_out([0.5, 0.5], normalize=True) == [0.0, 0.0]
    assert advantages.leave_one_out([1.0]) == [0.0]
    groups = [_group(0, [1, 1, 1, 1]), _group(1, [0, 1, 0, 0]), _group(2, [0, 0, 0, 0]), _group(3, [1])]
    adv, stats = advantages.compute(groups)
    assert stats.groups == 4 and stats.samples == 13
    assert stats.zero_advantage_groups == 3
    assert stats.as_metrics()["zero_advantage_frac"] == 0.75
    assert adv[1] == pytest.approx([-1 / 3, 1.0, -1 / 3, -1 / 3])
    assert stats.reward_mean == pytest.approx(6 / 13)


def test_non_finite_rewards_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        advantages.leave_one_out([1.0, math.nan])
