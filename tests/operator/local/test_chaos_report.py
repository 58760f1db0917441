"""`local.chaos_report`: the per-fault costs read from a `chaos.json`, on a hand-made timeline."""

from __future__ import annotations

import pytest

from plrl_operator.local import chaos_report


def _fault(kind: str, target: str, at: float) -> dict[str, object]:
    return {"fault": {"kind": kind, "target": target}, "step": None, "elapsed_s": at}


# One step per second until t=30; a hung generator-1 (stop at 30) is restarted at 35, after which the
# other generator alone trains one step every 2 s; generator-0 is slowed at 60 (no restart).
PROGRESS = [[float(t), t] for t in range(1, 31)] + [[30.0 + 2 * k, 30 + k] for k in range(1, 21)]
DOC = {
    "injected": [_fault("stop", "generator-1", 30.0), _fault("slow", "generator-0", 60.0)],
    "restarts": [{"elapsed_s": 35.0, "worker": "generator-1", "reason": "stopped responding"}],
    "progress": PROGRESS,
}


def test_each_fault_is_measured_from_its_injection() -> None:
    stop, slow = chaos_report.fault_costs(DOC, window_s=10.0)
    assert (stop.kind, stop.detection_s, stop.recovery_s) == ("stop", 5.0, 6.0)
    # 10 steps in the 10 s before, 5 in the 10 s after.
    assert stop.throughput_lost == pytest.approx(0.5)
    assert (slow.detection_s, slow.recovery_s) == (None, None)  # a slow process is not restarted
    assert slow.throughput_lost == pytest.approx(0.0)


def test_a_resume_from_an_earlier_checkpoint_is_not_counted_as_progress() -> None:
    doc = {
        "injected": [_fault("kill", "trainer-0", 10.0)],
        "restarts": [{"elapsed_s": 10.5, "worker": "trainer-0", "reason": "exited"}],
        # steps 1..10, then back to 8 (the checkpoint) at t=30, then 9, 10, 11.
        "progress": [[float(t), t] for t in range(1, 11)] + [[30.0, 8], [31.0, 9], [32.0, 10], [33.0, 11]],
    }
    (kill,) = chaos_report.fault_costs(doc, window_s=30.0)
    assert kill.detection_s == 0.5 and kill.recovery_s == 20.0
    assert kill.throughput_lost == pytest.approx(1 - 4 / 9)  # 10, then 9, 10, 11 after the resume
    (line,) = [k.line() for k in chaos_report.by_kind([kill])]
    assert line == (
        "kill trainer   injected 1, restarted 1; medians (min-max): detection 0.5 (0.5-0.5) s; "
        "training again after 20.0 (20.0-20.0) s; throughput lost (20 s after vs before) 56% (56%-56%)"
    )


def test_a_fault_on_a_target_still_starting_says_so_and_older_files_read_as_running() -> None:
    doc = {**DOC, "injected": [{**_fault("stop", "generator-1", 30.0), "target_starting": True}]}
    (stop,) = chaos_report.fault_costs(doc, window_s=10.0)
    assert stop.target_starting
    assert not chaos_report.fault_costs(DOC, window_s=10.0)[0].target_starting
