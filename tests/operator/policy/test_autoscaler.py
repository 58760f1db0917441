"""The autoscaler converges the way the seed's rule intends, never flaps, and never breaks a limit.

Scenarios run the pure policy in a closed loop against a synthetic job whose generators decode
`per_gen` tokens/s each and whose trainers process `per_train` tokens/s each (optionally noisy).
Steps are counted, not timed: nothing sleeps.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plrl_api import spec, utilisation
from plrl_operator.policy import autoscaler, planner, types

Action = types.ScaleAction


@dataclasses.dataclass
class Run:
    generators: list[int]  # I after each step
    decisions: list[types.Decision]  # the changes only


def run_job(
    policy: autoscaler.Policy,
    start: int,
    per_gen: float | Callable[[int], float],
    per_train: float,
    steps: int = 600,
    noise: float = 0.0,
    seed: int = 0,
) -> Run:
    """`per_gen`: each generator's rate, or a function of the step for a job whose rate moves."""
    rng = random.Random(seed)
    state = types.AutoscalerState()
    i, samples, trace, changes = start, list[types.RateSample](), [], []
    for step in range(1, steps + 1):

        def jitter() -> float:
            return 1 + rng.gauss(0, noise) if noise else 1.0

        gen = per_gen(step) if callable(per_gen) else per_gen
        samples.append(
            types.RateSample(step, i, gen * i * jitter(), per_train * (policy.n_gpus - i) * jitter())
        )
        d = autoscaler.decide(policy, state, types.Observation(step, i, tuple(samples[-100:])))
        state = d.state
        if d.changed:
            changes.append(d)
            i = d.generators
        trace.append(i)
    return Run(trace, changes)


def ratio(i: int, n: int, per_gen: float, per_train: float) -> float:
    return min(1.0, per_train * (n - i) / (per_gen * i))


def reversals(decisions: list[types.Decision]) -> int:
    return sum(a.action is not b.action for a, b in itertools.pairwise(decisions))


# The paper's H100 job: a generator makes U(192) = 0.384 tokens/flash, a trainer 1 / 4.92; the
# planner puts its optimum at I = 44 (balance at 44.3).
N, GEN, TRAIN = 128, 0.384, 1 / 4.919
PAPER = autoscaler.Policy(n_gpus=N)
OPTIMUM = planner.plan(planner.Workload(N, 128, planner.Lengths(1024)), utilisation.builtin("h100")).pipeline
assert OPTIMUM.generators == 44 and OPTIMUM.concurrency == 192


def test_trainer_bound_job_converges_to_the_planners_optimum() -> None:
    run = run_job(PAPER, start=80, per_gen=GEN, per_train=TRAIN)
    assert abs(run.generators[-1] - OPTIMUM.generators) <= 1
    assert all(d.action is Action.SCALE_DOWN for d in run.decisions)
    assert "trainers are the bottleneck" in run.decisions[0].reason
    assert run.decisions[0].reason.startswith("Removing generator GPUs 80 -> 75:")


def test_generator_bound_job_converges_to_the_planners_optimum() -> None:
    run = run_job(PAPER, start=20, per_gen=GEN, per_train=TRAIN)
    assert abs(run.generators[-1] - OPTIMUM.generators) <= 1
    assert all(d.action is Action.SCALE_UP for d in run.decisions)
    assert "generators are the bottleneck" in run.decisions[0].reason
    assert run.decisions[0].reason.startswith("Adding generator GPUs 20 -> 22:")


def test_balanced_job_stays_put() -> None:
    for start in (44, 45):  # the optimum, and one GPU past it (0.1% less throughput: not worth a move)
        run = run_job(PAPER, start=start, per_gen=GEN, per_train=TRAIN)
        assert run.decisions == []
        assert set(run.generators) == {start}


def test_inside_the_band_but_off_the_optimum_follows_the_planner() -> None:
    # I=47 keeps generation 5-10% ahead (the seed's band holds) but leaves trainers short: 2.6% less
    # throughput than at the optimum.
    assert PAPER.lower_ratio <= ratio(47, N, GEN, TRAIN) <= PAPER.upper_ratio
    run = run_job(PAPER, start=47, per_gen=GEN, per_train=TRAIN)
    assert [d.generators for d in run.decisions] == [44]
    reason = run.decisions[0].reason
    assert "is within [0.900, 0.950]" in reason
    assert "the band would hold, but the planner's optimum for the measured capacities is I=44" in reason
    assert "following the planner" in reason


def test_the_band_wants_more_generators_but_the_optimum_is_here() -> None:
    # At I=45 ratio is 0.99 (> 0.95): the seed's rule adds generators, which would cost throughput.
    assert ratio(45, N, GEN, TRAIN) > PAPER.upper_ratio
    d = autoscaler.decide(PAPER, types.AutoscalerState(), _obs(45, 30, GEN * 45, TRAIN * 83))
    assert d.action is Action.HOLD
    assert "generation's surplus over training is only" in d.reason
    assert "the planner's optimum for the measured capacities, I=44, gains only +0.1%" in d.reason
    d = autoscaler.decide(PAPER, types.AutoscalerState(), _obs(44, 30, GEN * 44, TRAIN * 84))
    assert d.action is Action.HOLD
    assert "generators are the bottleneck" in d.reason
    assert "I=44 is already the planner's optimum for the measured capacities" in d.reason


def test_each_band_edge_is_read_on_its_side_and_the_move_follows_the_capacities() -> None:
    # Rates chosen so the measured ratio sits just either side of each threshold at I=40 (N=128).
    per_gen = 1.0

    def at(r: float) -> types.Decision:
        return autoscaler.decide(PAPER, types.AutoscalerState(), _obs(40, 30, per_gen * 40, r * per_gen * 40))

    below_lower, above_lower = at(0.899), at(0.901)
    below_upper, above_upper = at(0.949), at(0.951)
    assert "is below 0.900: trainers are the bottleneck" in below_lower.reason
    assert "is within [0.900, 0.950]" in above_lower.reason and "is within" in below_upper.reason
    assert "is above 0.950" in above_upper.reason
    # All four are trainer-bound (ratio < 1), so the throughput-maximising move is always down:
    # the band's reading changes the words, the capacities decide the move.
    for d in (below_lower, above_lower, below_upper, above_upper):
        assert d.action is Action.SCALE_DOWN and d.generators < 40, d.reason
        assert d.ratio is not None
    assert (
        "following the planner" in above_upper.reason
        and "the band would add generators" in above_upper.reason
    )
    assert "toward the planner's optimum" in below_lower.reason


def test_a_move_needs_min_gain_on_both_sides_of_it() -> None:
    # One GPU off the optimum: gains just under and just over `min_gain` decide hold or move.
    def at(min_gain: float) -> types.Decision:
        policy = dataclasses.replace(PAPER, min_gain=min_gain)
        return autoscaler.decide(policy, types.AutoscalerState(), _obs(43, 30, GEN * 43, TRAIN * 85))

    gain = min(GEN * 44, TRAIN * 84) / min(GEN * 43, TRAIN * 85) - 1
    assert at(gain * 0.99).generators == 44
    assert at(gain * 1.01).action is Action.HOLD


def test_noisy_job_does_not_flap() -> None:
    for seed in range(5):
        run = run_job(PAPER, start=44, per_gen=GEN, per_train=TRAIN, steps=1000, noise=0.05, seed=seed)
        assert reversals(run.decisions) <= 1, [(d.step, d.generators) for d in run.decisions]
        assert len(run.decisions) <= 2
        assert all(42 <= i <= 46 for i in run.generators)


def test_noisy_job_still_converges_from_far_away() -> None:
    for seed in range(3):
        run = run_job(PAPER, start=90, per_gen=GEN, per_train=TRAIN, steps=800, noise=0.05, seed=seed)
        assert abs(run.generators[-1] - OPTIMUM.generators) <= 1
        assert reversals(run.decisions) <= 1


def test_changes_wait_for_the_cooldown_and_the_cadence() -> None:
    policy = dataclasses.replace(PAPER, cooldown_steps=30, every_steps=7)
    run = run_job(policy, start=90, per_gen=GEN, per_train=TRAIN, steps=300)
    steps = [d.step for d in run.decisions]
    assert len(steps) >= 3
    assert all(b - a >= 30 for a, b in itertools.pairwise(steps))


@pytest.mark.parametrize("period", [6, 40, 100])
def test_a_job_oscillating_around_a_threshold_rescales_at_most_once_per_cooldown(period: int) -> None:
    # The generators' rate swings +-15% around the optimum's every `period` steps (a square wave),
    # so the ratio crosses the band's edges both ways: faster than a look, about a cool-down, slower.
    policy = dataclasses.replace(PAPER, cooldown_steps=30)
    steps = 900

    def per_gen(step: int) -> float:
        return GEN * (1.15 if (step // (period // 2)) % 2 else 0.85)

    assert ratio(44, N, GEN * 0.85, TRAIN) > PAPER.upper_ratio  # generation short: add generators
    assert ratio(44, N, GEN * 1.15, TRAIN) < PAPER.lower_ratio  # generation ahead: fewer
    run = run_job(policy, start=44, per_gen=per_gen, per_train=TRAIN, steps=steps)
    at = [d.step for d in run.decisions]
    assert all(b - a >= policy.cooldown_steps for a, b in itertools.pairwise(at)), at
    assert len(at) <= steps // policy.cooldown_steps
    if period < policy.cooldown_steps:  # faster than a cool-down: the window averages it out
        assert len(at) <= 1, at


def test_a_step_that_would_jump_across_the_band_is_shortened() -> None:
    # Ratio 0.85 at I=48 wants a step down of 5; I=43 would be generator-bound again (ratio 1).
    state = types.AutoscalerState()
    samples = tuple(types.RateSample(s, 48, GEN * 48, TRAIN * 80 * 0.86 / 0.8816) for s in range(1, 11))
    d = autoscaler.decide(PAPER, state, types.Observation(10, 48, samples))
    assert d.action is Action.SCALE_DOWN
    assert 43 < d.generators < 48
    assert "predicted ratio" in d.reason


def test_coarse_pods_move_only_for_a_real_gain() -> None:
    # 16-GPU generator pods: one pod is a huge step, taken only if predicted throughput improves.
    policy = dataclasses.replace(PAPER, gpus_per_generator=16, gpus_per_trainer=16)
    run = run_job(policy, start=32, per_gen=GEN, per_train=TRAIN, steps=400)
    assert set(run.generators) <= {32, 48}
    assert reversals(run.decisions) == 0


def test_limits_bound_the_moves() -> None:
    capped = dataclasses.replace(PAPER, max_generators=30)
    assert max(run_job(capped, start=20, per_gen=GEN, per_train=TRAIN).generators) == 30
    # g_max <= 40 steps at H=192, B=128, L=1024 allows I <= 13
    lagged = dataclasses.replace(
        PAPER, concurrency=192, batch_size=128, lengths=planner.Lengths(1024), max_lag=40
    )
    run = run_job(lagged, start=4, per_gen=GEN, per_train=TRAIN)
    assert max(run.generators) == 13
    held = autoscaler.decide(lagged, types.AutoscalerState(), _obs(13, 30, GEN * 13, TRAIN * 115))
    assert held.action is Action.HOLD and "upper limit" in held.reason


def test_out_of_bounds_generators_are_moved_inside_at_once() -> None:
    policy = dataclasses.replace(PAPER, max_generators=40)
    d = autoscaler.decide(policy, types.AutoscalerState(), _obs(60, 1, 1.0, 1.0))
    assert d.generators == 40 and d.action is Action.SCALE_DOWN
    assert "outside the allowed range" in d.reason


def test_state_round_trips_through_status() -> None:
    s = types.AutoscalerState(last_eval_step=30, last_change_step=20, last_action=Action.SCALE_UP)
    assert types.AutoscalerState.from_dict(s.to_dict()) == s
    assert types.AutoscalerState.from_dict(None) == types.AutoscalerState()


def test_policy_from_job_spec() -> None:
    doc = {"apiVersion": "pipelinerl.io/v1alpha1", "kind": "PipelineRLJob", "metadata": {"name": "j"}}
    job = spec.parse_job(
        {
            **doc,
            "spec": {
                "model": {"name": "/models/demo"},
                "resources": {"totalGPUs": 32},
                "pipeline": {"autoscale": {"stepDown": 3, "maxGenerators": 20}},
            },
        }
    ).spec
    p = autoscaler.policy_for_job(job)
    assert (p.n_gpus, p.step_down, p.step_up, p.every_steps, p.max_generators) == (32, 3, 2, 10, 20)
    assert p.max_lag == 8 and p.concurrency == 64


def _obs(i: int, step: int, gen: float, train: float, count: int = 10) -> types.Observation:
    samples = tuple(types.RateSample(s, i, gen, train) for s in range(step - count + 1, step + 1))
    return types.Observation(step, i, samples)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(2, 256),
    gpg=st.sampled_from([1, 2, 4, 8]),
    gpt=st.sampled_from([1, 2, 4]),
    lo=st.integers(1, 64),
    hi=st.one_of(st.none(), st.integers(1, 255)),
    max_lag=st.one_of(st.none(), st.integers(0, 300)),
    h=st.integers(1, 512),
    b=st.integers(1, 2048),
    step_down=st.integers(1, 20),
    step_up=st.integers(1, 20),
    current=st.integers(1, 255),
    gen=st.floats(0.0, 1e6),
    train=st.floats(0.0, 1e6),
    last=st.sampled_from(list(Action)),
)
def test_decisions_never_break_a_limit(
    n: int,
    gpg: int,
    gpt: int,
    lo: int,
    hi: int | None,
    max_lag: int | None,
    h: int,
    b: int,
    step_down: int,
    step_up: int,
    current: int,
    gen: float,
    train: float,
    last: Action,
) -> None:
    if hi is not None and (hi < lo or hi >= n):
        hi = None
    policy = autoscaler.Policy(
        n_gpus=n,
        min_generators=lo,
        max_generators=hi,
        gpus_per_generator=gpg,
        gpus_per_trainer=gpt,
        concurrency=h,
        batch_size=b,
        lengths=planner.Lengths(1024),
        max_lag=max_lag,
        step_down=step_down,
        step_up=step_up,
    )
    allowed = policy.allowed()
    current = min(current, n - 1)
    state = types.AutoscalerState(last_eval_step=0, last_change_step=0, last_action=last)
    d = autoscaler.decide(policy, state, _obs(current, 50, gen, train))
    assert d.reason and "\n" not in d.reason
    if d.changed:
        i = d.generators
        assert i in allowed  # bounds, whole pods and g_max
        assert 0 < i < n and i % gpg == 0 and (n - i) % gpt == 0
        assert max_lag is None or planner.g_max(h, i, b, planner.Lengths(1024)) <= max_lag
        if current in allowed:
            unit = max(step_down, step_up, gpg * gpt)
            assert abs(i - current) <= unit
    elif current not in allowed:
        assert not allowed  # it only stays outside the limits when nothing is inside them


def test_the_reason_agrees_with_its_numbers_and_units() -> None:
    # Trainers slightly slower than generators, ratio 0.953 > 0.95: the rule adds generators, and the
    # reason must not call the (faster) generators the bottleneck.
    d = autoscaler.decide(PAPER, types.AutoscalerState(), _obs(40, 60, gen=17.74, train=16.9))
    assert d.ratio is not None and d.ratio > PAPER.upper_ratio
    assert "generators are the bottleneck" not in d.reason and "trainers are the bottleneck" not in d.reason
    assert "generation's surplus over training is only 5.0%" in d.reason
    assert "generators 17.74 tok/s, trainers 16.9 tok/s" in d.reason
    flashes = dataclasses.replace(PAPER, rate_unit="tokens/flash")
    d2 = autoscaler.decide(flashes, types.AutoscalerState(), _obs(40, 60, gen=10.0, train=20.0))
    assert "generators are the bottleneck (generators 10 tokens/flash, trainers 20 tokens/flash)" in d2.reason


def test_reversing_the_last_change_needs_more_gain_and_two_looks() -> None:
    after_up = types.AutoscalerState(last_eval_step=20, last_change_step=0, last_action=Action.SCALE_UP)

    def look(state: types.AutoscalerState, step: int, i: int) -> types.Decision:
        return autoscaler.decide(PAPER, state, _obs(i, step, GEN * i, TRAIN * (N - i)))

    # I=46 is 1.4% short of the optimum: enough for a move, not for undoing the last one (3%).
    small = look(after_up, 30, 46)
    assert small.action is Action.HOLD
    assert "(a move needs 3%, as it would reverse the last change)" in small.reason
    # I=50 is 5.5% short: the first look only notes it, the second, agreeing, moves.
    first = look(after_up, 30, 50)
    assert first.action is Action.HOLD and "waits for the next look to agree" in first.reason
    second = look(first.state, 40, 50)
    assert second.action is Action.SCALE_DOWN and second.generators == 45


def test_a_change_that_cannot_win_back_its_cost_is_not_taken() -> None:
    # I=46 -> 44 gains 1.4%; over the next decision period (20 steps of 10 s) that wins back a
    # change costing up to gain x period / (1 + gain) seconds, and no more.
    gain = min(GEN * 44, TRAIN * 84) / min(GEN * 46, TRAIN * 82) - 1
    edge = gain * 200 / (1 + gain)

    def look(cost: float | None) -> types.Decision:
        obs = dataclasses.replace(_obs(46, 30, GEN * 46, TRAIN * 82), step_seconds=10.0, rescale_cost_s=cost)
        return autoscaler.decide(PAPER, types.AutoscalerState(), obs)

    assert look(None).generators == 44  # nothing measured yet: the capacities decide alone
    assert look(edge * 0.99).generators == 44
    held = look(edge * 1.01)
    assert held.action is Action.HOLD
    assert "over the next decision period (200 s) does not win back the 2." in held.reason


def test_the_steps_right_after_a_start_or_a_change_are_not_counted() -> None:
    # At the optimum, but the trainers' first two steps after each (re)start ran at a third of their
    # capacity (first backward, allocator growth): counted, they would read as trainer-bound.
    def look(state: types.AutoscalerState, step: int, cold: set[int], warmup: int) -> types.Decision:
        p = dataclasses.replace(PAPER, every_steps=5, cooldown_steps=10, warmup_steps=warmup)
        trainers = [TRAIN * 84 / (3 if s in cold else 1) for s in range(1, step + 1)]
        samples = tuple(types.RateSample(s, 44, GEN * 44, t) for s, t in enumerate(trainers, start=1))
        return autoscaler.decide(p, state, types.Observation(step, 44, samples))

    start = types.AutoscalerState()
    assert look(start, 5, {1, 2}, warmup=0).action is Action.SCALE_DOWN  # what the warm-up prevents
    waiting = look(start, 5, {1, 2}, warmup=2)
    assert waiting.action is Action.HOLD and "waiting for rate samples at I=44 (3 of 5)" in waiting.reason
    held = look(start, 7, {1, 2}, warmup=2)
    assert held.action is Action.HOLD and "over steps 3-7" in held.reason, held.reason
    # A change at step 20 restarted the trainers: steps 21-22 are cold again, and left out.
    changed = types.AutoscalerState(last_eval_step=20, last_change_step=20, last_action=Action.SCALE_DOWN)
    assert look(changed, 30, {21, 22}, warmup=0).action is Action.SCALE_DOWN
    held = look(changed, 30, {21, 22}, warmup=2)
    assert held.action is Action.HOLD and "over steps 23-30" in held.reason, held.reason
