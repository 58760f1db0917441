"""`policy.health`: liveness from heartbeats, and slowness against peers. Pure.

Cases: an exited worker is EXITED whatever its Lease says; a running worker without a renewal, or
with only its predecessor's (renewed before this pod was created), is STARTING, and past the
start-up timeout STUCK_STARTING (hung before its first heartbeat; the soak found such hangs going
unnoticed); within the timeout HEALTHY, past it STALE, with the boundaries exact; `verdict` words
both for the controllers and says nothing of a healthy or starting worker; `slow` names a worker more than the
threshold below its peers' median, not one just above it, and needs peers to compare with.
"""

from __future__ import annotations

import datetime

from plrl_api import spec as spec_mod
from plrl_operator.policy import health

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def _at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def test_liveness_states() -> None:
    def classify(running: bool, started: float | None, renewed: float | None, now: float) -> health.Health:
        beat = health.Beat(
            "w", running, None if started is None else _at(started), None if renewed is None else _at(renewed)
        )
        return health.classify(beat, _at(now), timeout_s=30)

    assert classify(False, 0, 99, 100) is health.Health.EXITED
    assert classify(True, 0, None, 100) is health.Health.STARTING
    assert classify(True, 50, 40, 60) is health.Health.STARTING  # the predecessor's renewal
    assert classify(True, 0, 70, 100) is health.Health.HEALTHY  # exactly the timeout
    assert classify(True, 0, 69.999, 100) is health.Health.STALE
    assert classify(True, None, 10, 100) is health.Health.STALE  # creation time unknown


def test_a_worker_silent_since_it_started_is_stuck_after_the_startup_timeout() -> None:
    never = health.Beat("w", True, _at(0), None)
    predecessors = health.Beat("w", True, _at(0), _at(-5))  # only the killed process's renewal
    for beat in (never, predecessors):
        assert health.classify(beat, _at(120), 30, startup_timeout_s=120) is health.Health.STARTING
        assert health.classify(beat, _at(120.001), 30, startup_timeout_s=120) is health.Health.STUCK_STARTING
        assert health.classify(beat, _at(10_000), 30) is health.Health.STARTING  # no deadline given
    unknown = health.Beat("w", True, None, None)  # no start time: not judged
    assert health.classify(unknown, _at(10_000), 30, startup_timeout_s=120) is health.Health.STARTING


def test_verdict_says_why_a_silent_worker_is_replaced() -> None:
    hb = spec_mod.HeartbeatSpec(interval_seconds=1, timeout_seconds=4, startup_timeout_seconds=60)
    assert health.verdict(health.Beat("w", True, _at(0), _at(10)), _at(15), hb) == (
        "no heartbeat for 5 s (spec.heartbeat.timeoutSeconds=4): hung, stopped or cut off"
    )
    assert health.verdict(health.Beat("w", True, _at(0), None), _at(61.25), hb, digits=1) == (
        "no heartbeat in the 61.2 s since it started (spec.heartbeat.startupTimeoutSeconds=60): "
        "hung while starting"
    )
    assert health.verdict(health.Beat("w", True, _at(0), _at(10)), _at(13), hb) is None
    assert health.verdict(health.Beat("w", True, _at(0), None), _at(59), hb) is None
    # Unset: 900 s, or the heartbeat timeout if that is longer (a start may take as long as a silence).
    assert spec_mod.HeartbeatSpec().startup_deadline_seconds == 900
    assert spec_mod.HeartbeatSpec(timeout_seconds=3600).startup_deadline_seconds == 3600


def test_slow_is_relative_to_the_peers_median() -> None:
    rates = {"g0": 100.0, "g1": 98.0, "g2": 83.0, "g3": 84.0}
    # g2: 83.0 < 0.85 * median(100, 98, 84) = 83.3; g3: 84.0 is not below 0.85 * 98.
    assert health.slow(rates, threshold=0.15) == ["g2"]
    assert health.slow({"g0": 1.0}, threshold=0.15) == []  # nobody to compare with
    assert health.slow({"g0": 0.0, "g1": 0.0}, threshold=0.15) == []  # idle peers: no verdict
