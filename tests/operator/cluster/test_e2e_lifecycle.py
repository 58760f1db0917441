"""End to end, around a training job: suspend and resume, an operator restart, input that cannot run.

Cases: `spec.suspend: true` mid-run stops the pods (Suspended), the trainer checkpoints the step it
reached and the checkpoints stay, and resuming continues from that step (the new trainer says so, the
step records go on from it) to Succeeded,
every prompt accounted for; restarting the operator while the job trains changes nothing (the same
pods keep running, with no restart, and the new operator writes nothing but status) and loses nothing
(Succeeded at totalSteps, accounting intact); a job whose model directory does not exist does not hang:
its workers exit at once, crash-loop with back-off, the Ready condition says why, WorkerRestarted
events quote the worker's own words, and with `failurePolicy.maxRestarts` used up the job is Failed
with a condition naming the pod, exit code 2 and the missing path.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.infra import tools
from tests.operator.cluster import e2e, support
from tests.operator.cluster.support import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]
PROMPTS_PER_STEP = 64 // 8


def _step(job: e2e.Tiny) -> int:
    step = job.row().get("STEP", "")
    return int(step) if step.isdigit() else 0


def test_suspend_keeps_the_checkpoint_and_resume_continues_from_it(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    steps = 30
    job = tiny(training={"totalSteps": steps, "checkpoint": {"everySteps": 5}})
    job.apply()
    job.watch("Succeeded", timeout_s=240, stop_at_step=8)
    job.patch({"suspend": True})
    job.watch("Suspended", timeout_s=60)
    eventually(lambda: not job.pods(), 90, "the pods to stop")
    saved = sorted(p.name for p in job.checkpoints.glob("step-*"))
    assert saved, "no checkpoint was kept"
    kept = int(saved[-1].removeprefix("step-"))
    # Stopped for the suspend, the trainer checkpointed the step it had reached (not only every 5th).
    assert 8 <= kept < steps and kept == job.records()[-1].step

    job.patch({"suspend": False})
    seen = job.watch("Succeeded", timeout_s=240)
    assert seen[-1].row["STEP"] == str(steps) and seen[-1].row["RESTARTS"] == "0"
    logs = job.log_tails(400)
    assert f"resumed from /checkpoints: step {kept}, weight version {kept}" in logs, logs
    rows = job.records()
    assert [r.step for r in rows] == list(range(1, steps + 1))
    p = rows[-1].prompts
    assert p.balanced and p.outstanding == 0 and p.trained + p.dropped_by_lag == steps * PROMPTS_PER_STEP, p


def test_restarting_the_operator_while_the_job_trains_changes_nothing(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    steps = 30
    job = tiny(training={"totalSteps": steps})
    job.apply()
    job.watch("Succeeded", timeout_s=240, stop_at_step=3)
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job.pods()}
    at = _step(job)
    operator.restart()
    assert operator.writes_to(namespace) == [] or all("/status" in w for w in operator.writes_to(namespace))
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job.pods()}
    if _step(job) < steps:  # still training: the same pods, never restarted
        assert now == pods
        assert all(
            c.get("restartCount") == 0 for p in job.pods() for c in p["status"].get("containerStatuses") or []
        )
    seen = job.watch("Succeeded", timeout_s=240)
    assert seen[-1].row["STEP"] == str(steps) and seen[-1].row["RESTARTS"] == "0"
    assert at < steps, "the job finished before the operator restarted: the check proves nothing"
    writes = operator.writes_to(namespace)
    # Until the job succeeded the new operator wrote only status; then it scaled both StatefulSets to 0.
    assert [w for w in writes if "/status" not in w and "statefulsets" not in w] == [], writes
    rows = job.records()
    assert [r.step for r in rows] == list(range(1, steps + 1))
    p = rows[-1].prompts
    assert p.balanced and p.outstanding == 0 and p.trained + p.dropped_by_lag == steps * PROMPTS_PER_STEP, p


def test_a_job_whose_workers_cannot_start_fails_with_the_reason(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    job = tiny(model={"name": "/models/missing"}, failurePolicy={"maxRestarts": 2})
    job.apply()
    why = (
        "spec.model.name: /models/missing is not a Hugging Face model directory (no such directory); "
        "in a cluster it must be on a volume the pods mount (spec.model.volume)"
    )
    # On the way: the pods crash-loop with back-off, and the Ready condition says why.
    ready = eventually(
        lambda: (
            next(
                (
                    c
                    for c in job.status().get("conditions", [])
                    if c["type"] == "Ready" and "exit code 2" in c["message"]
                ),
                None,
            )
            or (job.row().get("PHASE") == "Failed" and {"message": "(already Failed)"})
        ),
        120,
        "a Ready condition naming the crash",
    )
    assert "CrashLoopBackOff" in ready["message"] or ready["message"] == "(already Failed)", ready
    job.watch("Failed", timeout_s=180)
    s = job.status()
    failed = next(c for c in s["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "RestartsExhausted"
    assert "exited with code 2" in failed["message"] and why in failed["message"], failed["message"]
    assert "spec.failurePolicy.maxRestarts=2 restarts are used up" in failed["message"]
    assert s["restarts"] == 2
    describe = kubectl("describe", "plrljob", job.name, "-n", namespace).stdout
    assert describe.count("WorkerRestarted") >= 1 and "JobFailed" in describe
    assert "/models/missing is not a Hugging Face model directory" in describe
    eventually(lambda: not job.pods(), 90, "a failed job's pods to stop")
    pod_events = kubectl("get", "events", "-n", namespace, "--field-selector", "reason=BackOff").stdout
    assert "Back-off restarting failed container" in pod_events
    time.sleep(2)
    assert job.row()["PHASE"] == "Failed"
