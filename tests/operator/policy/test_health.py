"""`policy.health`: liveness from heartbeats, and slowness against peers. Pure.

Cases: an exited worker is EXITED whatever its Lease says; a running worker without a renewal, or
with only its predecessor's (renewed before this pod was created), is STARTING; within the
timeout HEALTHY, past it STALE, with the boundary exact; `slow` names a worker more than the
threshold below its peers' median, not one just above it, and needs peers to compare with.
"""

from __future__ import annotations

import datetime

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


def test_slow_is_relative_to_the_peers_median() -> None:
    rates = {"g0": 100.0, "g1": 98.0, "g2": 83.0, "g3": 84.0}
    # g2: 83.0 < 0.85 * median(100, 98, 84) = 83.3; g3: 84.0 is not below 0.85 * 98.
    assert health.slow(rates, threshold=0.15) == ["g2"]
    assert health.slow({"g0": 1.0}, threshold=0.15) == []  # nobody to compare with
    assert health.slow({"g0": 0.0, "g1": 0.0}, threshold=0.15) == []  # idle peers: no verdict
