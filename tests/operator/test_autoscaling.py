"""The operator's autoscaler (`plrl_operator.autoscaling`), fed from Leases as the timer feeds it.

Cases: a generator-bound job is told to add a generator once enough new steps were reported; the
reading takes only current pods' Leases and says a generator without a report yet is missing; a
restarted operator continues from `status.autoscaler` (state, the change being timed) without
counting a change twice; a change's cost is timed until training passes the step it was made at.
"""

from __future__ import annotations

import datetime
from typing import Any

from plrl_api import names, plan, records, spec
from plrl_operator import autoscaling, status
from tests import samples

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
AUTOSCALE = {"enabled": True, "everySteps": 2, "cooldownSteps": 0, "warmupSteps": 0}


def _job() -> spec.PipelineRLJob:
    return samples.job(
        {
            "model": {"name": "/models/demo"},
            "resources": {"totalGPUs": 4},
            "pipeline": {"generators": 1, "autoscale": AUTOSCALE},
        }
    )


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": "2026-01-01T11:00:00Z"}, "spec": {}, "status": {}}


def _lease(holder: str, report: records.WorkerReport) -> dict[str, Any]:
    return {
        "metadata": {"name": f"demo-{holder}", "annotations": records.lease_annotations(report)},
        "spec": {"holderIdentity": holder, "renewTime": T0.strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
    }


def _children(
    step: int, generator_capacity: float | None, trainer_capacity: float = 900.0
) -> status.Children:
    """One generator pod and three trainer pods (I = 1 of 4), as the timer sees them."""
    pods = ["demo-gen-0", "demo-train-0", "demo-train-1", "demo-train-2"]
    rank0 = records.WorkerReport(
        role=names.TRAINER,
        capacity_tokens_per_second=trainer_capacity,
        progress=records.Progress(step=step),
    )
    leases = [_lease("demo-train-0", rank0)]
    if generator_capacity is not None:
        gen = records.WorkerReport(role=names.GENERATOR, capacity_tokens_per_second=generator_capacity)
        leases.append(_lease("demo-gen-0", gen))
    # A generator pod that left (scaled away) still has its Lease: it must not count.
    leases.append(
        _lease("demo-gen-1", records.WorkerReport(role=names.GENERATOR, capacity_tokens_per_second=1.0))
    )
    return status.Children(pods=[_pod(p) for p in pods], leases=leases)


def _read(children: status.Children, pod_plan: plan.PodPlan) -> status.Capacities:
    caps = status.capacities(children, "demo", pod_plan)
    assert caps is not None
    return caps


def test_the_reading_takes_current_pods_only_and_names_a_missing_generator() -> None:
    job = _job()
    one = plan.PodPlan.of(job.spec, 1)
    caps = status.capacities(_children(7, 200.0), "demo", one)
    assert caps == status.Capacities(step=7, trainers=900.0, generators=(200.0,))
    assert _read(_children(7, None), one) == status.Capacities(7, 900.0, (None,))
    two = plan.PodPlan.of(job.spec, 2)  # demo-gen-1 is not a current pod: its Lease is history
    assert _read(_children(7, 200.0), two) == status.Capacities(7, 900.0, (200.0, None))
    assert status.capacities(status.Children(), "demo", one) is None  # rank 0 has said nothing yet


def test_a_generator_bound_job_gets_a_generator_and_a_restarted_operator_goes_on_from_status() -> None:
    job = _job()
    one = plan.PodPlan.of(job.spec, 1)
    scaler = autoscaling.JobAutoscaler.restore(job.spec, None, 0)
    t = 1000.0
    # One generator at 200 tokens/s against trainers managing 900: I = 2 trains 400 tokens/s.
    assert scaler.look(one, _read(_children(1, None), one), t) is None  # incomplete
    assert scaler.look(one, _read(_children(1, 200.0), one), t + 1) is None  # step seen
    assert scaler.look(one, _read(_children(2, 200.0), one), t + 2) is None
    d = scaler.look(one, _read(_children(3, 200.0), one), t + 3)
    assert d is not None and (d.previous, d.generators, d.step) == (1, 2, 3), scaler.loop.last
    scaler.applied(t + 3, reached=3)
    saved = scaler.to_status()
    assert saved.changes == 1 and saved.last_change is not None
    assert (
        saved.last_change.startswith("I 1 -> 2 at step 3: ")
        and "generators are the bottleneck" in saved.last_change
    )
    assert (saved.timing_since, saved.timing_step) == (t + 3, 3)

    # The operator restarts: status is all it has. The trainers resumed from step 2.
    two = plan.PodPlan.of(job.spec, 2)
    again = autoscaling.JobAutoscaler.restore(job.spec, saved, 2)
    assert again.loop.state == scaler.loop.state
    caps = status.Capacities(step=3, trainers=600.0, generators=(200.0, 200.0))
    assert again.look(two, caps, t + 10) is None  # step 3 trained again: not past it yet
    assert again.loop.cost_s is None
    caps = status.Capacities(step=4, trainers=600.0, generators=(200.0, 200.0))
    again.look(two, caps, t + 12)
    assert again.loop.cost_s == 9.0  # from the change (t + 3) until training passed step 3
    after = again.to_status()
    assert after.changes == 1 and after.last_change == saved.last_change  # not counted twice
    assert after.last_change_cost_seconds == 9.0 and after.timing_since is None
