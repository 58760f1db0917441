"""`local.autoscaling` and `policy.rates`: what `plrl run`'s autoscaler samples and when it decides.

Pure, no processes: one sample per trained step from the step's record (trainer capacity) and the
generators' reported capacities; a missing capacity leaves the step out; steps trained again after
a resize (the trainers resumed from a checkpoint) are not fed twice, so the policy's step clock
never runs backwards; a generator-bound job gets a change of I with a reason.
"""

from __future__ import annotations

import json
import pathlib

from plrl_api import records
from plrl_operator.local import autoscaling
from plrl_operator.policy import autoscaler, rates, types
from tests import samples

POLICY = autoscaler.Policy(n_gpus=4, every_steps=2, cooldown_steps=4)


def _rows(first: int, last: int, busy_s: float = 1.0) -> list[records.StepRecord]:
    return [
        samples.step_record(step=s, version=s, busy_s=busy_s, completion_tokens=900)
        for s in range(first, last + 1)
    ]


def test_a_sample_needs_every_workers_capacity() -> None:
    assert rates.sample(3, 2, [100.0, 50.0], 300.0) == types.RateSample(3, 2, 150.0, 300.0)
    assert rates.sample(3, 2, [100.0, None], 300.0) is None  # a generator without a measurement yet
    assert rates.sample(3, 2, [100.0, 0.0], 300.0) is None  # one that decoded nothing measured nothing
    assert rates.sample(3, 2, [100.0, 50.0], None) is None
    assert rates.sample(3, 2, [], 300.0) is None


def test_a_generator_bound_job_is_told_to_add_generators(tmp_path: pathlib.Path) -> None:
    a = autoscaling.LocalAutoscaler(POLICY)
    # One generator at 200 tokens/s against 3 trainer ranks managing 900 tokens per busy second:
    # I=2 trains 400 tokens/s (I=3 would leave one rank for 300).
    assert a.look_at(_rows(1, 1), 1, [200.0], now=0.0) is None  # first look: one sample, waiting for two
    d = a.look_at(_rows(1, 3), 1, [200.0], now=0.0)
    assert d is not None and (d.previous, d.generators) == (1, 2), a.last
    assert "generators are the bottleneck" in d.reason
    # Carried out 12.5 s into the run at step 3; the change has cost what it took to train past it.
    a.applied(12.5, reached=3)
    a.look_at(_rows(1, 3), 2, [200.0, 200.0], now=16.5)
    assert a.cost_s is None  # step 3 trained again after the restart: not past it yet
    a.look_at(_rows(1, 4), 2, [200.0, 200.0], now=19.5)
    assert a.cost_s == 7.0
    a.write(tmp_path)
    written = (tmp_path / autoscaling.DECISIONS_FILE).read_text()
    assert '"elapsed_s": 12.5' in written and '"lastChangeCostSeconds": 7.0' in written
    # Every look that decided says why, holds included; a look without new steps decides nothing.
    looks = json.loads(written)["looks"]
    assert [(x["step"], x["generators"]) for x in looks] == [(1, 1), (3, 2), (4, 2)], looks
    assert all(x["reason"] for x in looks)
    assert a.summary() == "autoscaler: 1 change(s) of I: 1 -> 2 at step 3"


def test_steps_trained_again_after_a_resize_are_not_fed_twice() -> None:
    a = autoscaling.LocalAutoscaler(POLICY)
    assert a.look_at(_rows(1, 3), 1, [100.0], now=0.0) is not None
    fed = len(a.samples)
    # The trainers resumed from the checkpoint at step 2: steps 3.. come again, then new ones.
    assert a.look_at(_rows(1, 3), 2, [100.0, 100.0], now=0.0) is None
    assert len(a.samples) == fed and a.last is not None and a.last.step == 3
    a.look_at(_rows(1, 5), 2, [100.0, 100.0], now=0.0)
    assert [s.step for s in a.samples][fed:] == [4, 5]
    assert all(s.generators == 2 for s in list(a.samples)[fed:])
