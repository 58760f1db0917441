"""compute_status: what `kubectl get/describe plrljob` shows, from the live children alone.

Cases: a new job is Pending; pods rejected for too few GPUs give PodsScheduled=False/Unschedulable
with the scheduler's words and a hint; all pods ready on the current revision is Running with
Ready=True; a spec change rolling out is Scaling; suspend is Suspended; recomputing from the same
inputs later changes nothing (so no write); the coordinator's Lease fills step/lag/reward; I comes
from the spec, else status, else the planner; child-write decisions (`k8s.needs_write`); the
WorkersHealthy condition from the worker pods' Lease renewTimes (current, one silent past
heartbeat.timeoutSeconds, none yet, Leases of gone pods and of a pod's predecessor ignored).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from plrl_api import names, records, spec
from plrl_operator import k8s, phases, status
from plrl_operator.policy import decide, health
from tests import samples

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)


def _job(**spec_overrides: Any) -> spec.PipelineRLJob:
    body = {
        "model": {"name": "/models/demo"},
        "resources": {"totalGPUs": 4},
        "pipeline": {"generators": 2},
        **spec_overrides,
    }
    return samples.job(body)


def _sts(
    role: str, replicas: int, ready: int, *, generation: int = 1, observed: int = 1, rev: str = "r1"
) -> dict[str, Any]:
    return {
        "metadata": {"name": f"demo-{role}", "generation": generation, "labels": {names.LABEL_ROLE: role}},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": observed,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": ready,
            "currentRevision": rev,
            "updateRevision": rev,
        },
    }


def _pod(
    role: str, i: int, *, node: str | None = "gpu-1", ready: bool = True, rev: str = "r1", why: str = ""
) -> dict[str, Any]:
    conditions = []
    if node:
        conditions.append({"type": "PodScheduled", "status": "True"})
        conditions.append({"type": "Ready", "status": "True" if ready else "False"})
    elif why:
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
        )
    return {
        "metadata": {
            "name": f"demo-{role}-{i}",
            "labels": {names.LABEL_ROLE: role, "controller-revision-hash": rev},
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running" if node else "Pending", "conditions": conditions},
    }


def _running_children() -> status.Children:
    return status.Children(
        statefulsets={"generator": _sts("generator", 2, 2), "trainer": _sts("trainer", 2, 2)},
        pods=[_pod("generator", 0), _pod("generator", 1), _pod("trainer", 0), _pod("trainer", 1)],
    )


def _cond(s: status.JobStatus, ctype: str) -> status.Condition:
    return next(c for c in s.conditions if c.type == ctype)


def test_new_job_is_pending_with_its_plan() -> None:
    s = status.compute_status(_job(), 2, status.Children(), status.JobStatus(), T0)
    assert s.phase is phases.Phase.PENDING
    assert (s.generators, s.trainers, s.ready) == (2, 2, "0/4")
    assert _cond(s, "PodsScheduled").reason == "WaitingForPods"
    assert _cond(s, "Ready").status == "False"
    assert s.observed_generation == 1


def test_too_few_gpus_says_why() -> None:
    why = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available"
    children = status.Children(
        statefulsets={"generator": _sts("generator", 2, 0), "trainer": _sts("trainer", 2, 0)},
        pods=[
            _pod("generator", 0),
            _pod("generator", 1, ready=False),
            _pod("trainer", 0, node=None, why=why),
        ],
    )
    s = status.compute_status(_job(), 2, children, status.JobStatus(), T0)
    assert s.phase is phases.Phase.PENDING
    c = _cond(s, "PodsScheduled")
    assert (c.status, c.reason) == ("False", "Unschedulable")
    assert "pod demo-trainer-0: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu" in c.message
    assert "needs 4 x nvidia.com/gpu" in c.message and "nvidia.com/gpu.present=true" in c.message


def test_all_ready_is_running() -> None:
    s = status.compute_status(_job(), 2, _running_children(), status.JobStatus(phase="Starting"), T0)
    assert s.phase is phases.Phase.RUNNING
    assert s.ready == "4/4"
    assert (_cond(s, "Ready").status, _cond(s, "Ready").reason) == ("True", "AllPodsReady")
    assert _cond(s, "PodsScheduled").reason == "AllPodsScheduled"
    assert s.start_time == "2026-01-01T12:00:00Z"


def test_pods_of_an_old_revision_do_not_count_as_ready() -> None:
    children = _running_children()
    children.pods[0]["metadata"]["labels"]["controller-revision-hash"] = "r0"
    s = status.compute_status(_job(), 2, children, status.JobStatus(phase="Starting"), T0)
    assert s.ready == "3/4" and s.phase is phases.Phase.STARTING


def test_rolling_edit_is_scaling() -> None:
    children = _running_children()
    children.statefulsets["generator"] = _sts("generator", 2, 2, generation=2, observed=1)
    s = status.compute_status(_job(), 2, children, status.JobStatus(phase="Running"), T0)
    assert s.phase is phases.Phase.SCALING
    assert "rolling out" in _cond(s, "Ready").message


def test_suspend() -> None:
    children = status.Children(
        statefulsets={"generator": _sts("generator", 0, 0), "trainer": _sts("trainer", 0, 0)}
    )
    s = status.compute_status(_job(suspend=True), 2, children, status.JobStatus(phase="Running"), T0)
    assert s.phase is phases.Phase.SUSPENDED
    assert _cond(s, "Suspended").status == "True"
    assert s.ready == "0/0"


def test_recomputing_later_changes_nothing() -> None:
    first = status.compute_status(_job(), 2, _running_children(), status.JobStatus(phase="Starting"), T0)
    again = status.compute_status(_job(), 2, _running_children(), first, T1)
    assert not status.changed(first, again)
    assert all(c.last_transition_time == "2026-01-01T12:00:00Z" for c in again.conditions)


def test_a_flip_moves_the_transition_time_of_that_condition_only() -> None:
    first = status.compute_status(_job(), 2, _running_children(), status.JobStatus(phase="Starting"), T0)
    broken = _running_children()
    broken.pods.pop()
    later = status.compute_status(_job(), 2, broken, first, T1)
    assert status.changed(first, later)
    assert later.phase is phases.Phase.RECOVERING
    assert _cond(later, "Ready").last_transition_time == "2026-01-01T12:05:00Z"
    assert _cond(later, "Suspended").last_transition_time == "2026-01-01T12:00:00Z"


def test_coordinator_lease_fills_progress() -> None:
    report = {
        "step": 42,
        "weightVersion": 42,
        "lag": {"mean": 1.5, "max": 4},
        "reward": 0.62,
        "throughput": {"generatedTokensPerSecond": 900.0, "trainedTokensPerSecond": 850.0, "ratio": 0.94},
    }
    lease = {
        "metadata": {
            "name": "demo-demo-trainer-0",
            "annotations": {names.ANNOTATION_ROLE: "trainer", names.ANNOTATION_PROGRESS: json.dumps(report)},
        }
    }
    broken = {
        "metadata": {
            "name": "demo-demo-gen-0",
            "annotations": {names.ANNOTATION_ROLE: "generator", names.ANNOTATION_PROGRESS: "{not json"},
        }
    }
    children = _running_children()
    children.leases.extend([broken, lease])
    s = status.compute_status(_job(), 2, children, status.JobStatus(phase="Running"), T0)
    assert (s.step, s.weight_version, s.reward) == (42, 42, 0.62)
    assert s.lag is not None and s.lag.max == 4
    assert s.throughput is not None and s.throughput.trained_tokens_per_second == 850.0
    dumped = status.dump(s)
    assert dumped["throughput"]["trainedTokensPerSecond"] == 850.0 and "completionTime" not in dumped
    assert status.patch(s)["completionTime"] is None  # a merge patch removes what is no longer set
    assert status.patch(s)["step"] == 42


def test_progress_is_rounded_to_what_a_table_shows() -> None:
    report = {
        "step": 7,
        "lag": {"mean": 1.547400611620795, "max": 3},
        "reward": 0.25349702380952377,
        "throughput": {
            "generatedTokensPerSecond": 1557.75,
            "trainedTokensPerSecond": 4674.82,
            "ratio": 3.0010109,
        },
    }
    annotations = {names.ANNOTATION_ROLE: "trainer", names.ANNOTATION_PROGRESS: json.dumps(report)}
    lease = {"metadata": {"name": "l", "annotations": annotations}}
    children = _running_children()
    children.leases.append(lease)
    s = status.compute_status(_job(), 2, children, status.JobStatus(phase="Running"), T0)
    assert s.lag is not None and s.throughput is not None
    assert (s.lag.mean, s.reward, s.throughput.ratio) == (1.55, 0.253, 3.001)
    assert (s.throughput.generated_tokens_per_second, s.throughput.trained_tokens_per_second) == (1558, 4675)


def test_ready_says_why_a_pod_is_not_ready() -> None:
    children = _running_children()
    crashing = _pod("trainer", 0, ready=False)
    crashing["status"]["containerStatuses"] = [
        {
            "name": "trainer",
            "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting ..."}},
            "lastState": {
                "terminated": {"exitCode": 2, "reason": "Error", "message": "plrl-worker: bad model"}
            },
        }
    ]
    starting = _pod("generator", 0, ready=False)
    starting["status"]["containerStatuses"] = [
        {"name": "generator", "state": {"waiting": {"reason": "ContainerCreating"}}}
    ]
    children.pods[0], children.pods[2] = starting, crashing
    s = status.compute_status(_job(), 2, children, status.JobStatus(phase="Running"), T0)
    assert _cond(s, "Ready").message == (
        "2/4 pods ready; pod demo-trainer-0: container trainer CrashLoopBackOff, last exit code 2: "
        "Error: plrl-worker: bad model"
    )
    children.pods[2] = _pod("trainer", 0)
    s = status.compute_status(_job(), 2, children, status.JobStatus(phase="Running"), T0)
    assert _cond(s, "Ready").message == "3/4 pods ready"  # merely starting: nothing to say


def _finished_lease(holder: str, renewed: str) -> dict[str, Any]:
    progress = json.dumps({"step": 1000, "finished": True})
    return {
        "metadata": {"annotations": {names.ANNOTATION_ROLE: "trainer", names.ANNOTATION_PROGRESS: progress}},
        "spec": {"holderIdentity": holder, "renewTime": renewed},
    }


def test_finished_report_of_a_current_pod_succeeds_the_job() -> None:
    children = _running_children()
    children.leases.append(_finished_lease("demo-trainer-0", "2026-01-01T11:59:59.000000Z"))
    verdict = decide.decide(_job().spec, status.observation(children), decide.History())
    assert [type(d) for d in verdict.decisions] == [decide.Finish]
    s = status.compute_status(_job(), 2, children, status.JobStatus(phase="Running"), T0, verdict.history)
    assert s.phase is phases.Phase.SUCCEEDED and s.completion_time == "2026-01-01T12:00:00Z"
    assert _cond(s, "Succeeded").reason == "TrainingComplete"
    # The operator restarts: the outcome is read back from the status it wrote, not decided again.
    again = decide.decide(_job().spec, status.observation(children), status.history(s))
    assert again.decisions == () and again.history.outcome is decide.Outcome.SUCCEEDED


def test_a_stale_finished_report_does_not_end_the_job() -> None:
    children = _running_children()
    # Renewed before the current pod was created (a predecessor's), or by a pod that is gone.
    children.pods[2]["metadata"]["creationTimestamp"] = "2026-01-01T11:00:00Z"
    children.leases.append(_finished_lease("demo-trainer-0", "2026-01-01T10:00:00.000000Z"))
    children.leases.append(_finished_lease("demo-trainer-9", "2026-01-01T11:59:59.000000Z"))
    assert not status.observation(children).finished


def test_generators_come_from_spec_then_status_then_planner() -> None:
    pinned = _job()
    assert decide.current_generators(pinned.spec, 1) == 2
    free = _job(pipeline={}, resources={"totalGPUs": 16})
    assert decide.current_generators(free.spec, 4) == 4  # the autoscaler's I
    assert decide.current_generators(free.spec, None) == 5  # planner: min(16 // 3, 64)
    assert decide.current_generators(free.spec, 16) == 5  # no longer fits


def test_parse_ignores_foreign_and_broken_status() -> None:
    assert status.parse({"phase": "Running", "kopf": {"x": 1}}).phase is phases.Phase.RUNNING
    assert status.parse({"phase": "Sleeping"}) == status.JobStatus()
    assert status.parse(None) == status.JobStatus()


def test_needs_write() -> None:
    desired = {
        "kind": "ConfigMap",
        "metadata": {"name": "a", "annotations": {names.ANNOTATION_DESIRED_HASH: "h1"}},
    }
    assert k8s.needs_write(desired, None)
    assert not k8s.needs_write(desired, {"metadata": {"annotations": {names.ANNOTATION_DESIRED_HASH: "h1"}}})
    assert k8s.needs_write(desired, {"metadata": {"annotations": {names.ANNOTATION_DESIRED_HASH: "h0"}}})
    assert k8s.needs_write(desired, {"metadata": {}})  # created by someone else / by hand
    secret = {
        "kind": "Secret",
        "metadata": {"name": "t", "annotations": {names.ANNOTATION_CREATE_ONLY: "true"}},
    }
    assert k8s.needs_write(secret, None)
    assert not k8s.needs_write(secret, {"metadata": {}})  # never rotated by a reconcile


def _beat(pod: str, renewed: datetime.datetime) -> dict[str, Any]:
    """A worker Lease as the operator's index holds it."""
    return {
        "metadata": {"name": f"demo-{pod}", "annotations": {}},
        "spec": {"holderIdentity": pod, "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
    }


def _health(children: status.Children, now: datetime.datetime, **spec_overrides: Any) -> status.Condition:
    job = _job(heartbeat={"intervalSeconds": 5, "timeoutSeconds": 30}, **spec_overrides)
    return _cond(
        status.compute_status(job, 2, children, status.JobStatus(phase="Running"), now), "WorkersHealthy"
    )


def test_workers_healthy_while_every_lease_is_renewed_within_the_timeout() -> None:
    children = _running_children()
    children.leases.extend(_beat(p["metadata"]["name"], T0) for p in children.pods)
    c = _health(children, T0 + datetime.timedelta(seconds=29))
    assert (c.status, c.reason) == ("True", "HeartbeatsCurrent")
    assert c.message == "4 workers renewed their Lease within 30s"


def test_a_silent_worker_is_named_with_its_last_renewal() -> None:
    children = _running_children()
    children.leases.extend(_beat(p["metadata"]["name"], T1) for p in children.pods[1:])
    children.leases.append(_beat("demo-generator-0", T0))
    c = _health(children, T1 + datetime.timedelta(seconds=10))  # gen-0 silent for 5 min 10 s
    assert (c.status, c.reason) == ("False", "HeartbeatTimeout")
    assert c.message == (
        "1/4 workers silent for more than spec.heartbeat.timeoutSeconds=30: "
        "demo-generator-0 (last renewed 2026-01-01T12:00:00Z)"
    )
    # Still silent 10 s later (the others still current): same message, so no new status write.
    assert _health(children, T1 + datetime.timedelta(seconds=20)).message == c.message


def test_no_lease_yet_is_unknown() -> None:
    c = _health(_running_children(), T0)
    assert (c.status, c.reason) == ("Unknown", "NoHeartbeats")


def test_leases_of_gone_pods_and_of_a_pods_predecessor_are_ignored() -> None:
    children = _running_children()
    children.pods[0]["metadata"]["creationTimestamp"] = "2026-01-01T12:04:00Z"  # gen-0 was replaced at 12:04
    children.leases.append(_beat("demo-generator-0", T0))  # its predecessor's last renewal (12:00)
    children.leases.append(_beat("demo-generator-7", T0))  # a pod scaled away long ago
    assert _health(children, T1).reason == "NoHeartbeats"
    children.leases.append(_beat("demo-trainer-0", T1))
    c = _health(children, T1)
    assert (c.status, c.message) == ("True", "1 workers renewed their Lease within 30s")


def _running_since(pod: dict[str, Any], started: str) -> dict[str, Any]:
    pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
    pod["status"]["containerStatuses"] = [
        {"name": "worker", "restartCount": 0, "state": {"running": {"startedAt": started}}}
    ]
    return pod


def test_a_running_pod_whose_lease_went_stale_is_hung_and_replaced() -> None:
    job = _job(heartbeat={"intervalSeconds": 2, "timeoutSeconds": 10})
    children = _running_children()
    for pod in children.pods:
        _running_since(pod, "2026-01-01T11:58:00Z")  # 2 min: within the start-up timeout
    renewals = {
        "demo-generator-0": "2026-01-01T11:59:59.000000Z",  # fresh
        "demo-generator-1": "2026-01-01T11:59:45.000000Z",  # silent for 15 s > 10 s: hung
        "demo-trainer-0": "2026-01-01T10:59:00.000000Z",  # before its container started: starting
    }
    for holder, renewed in renewals.items():
        children.leases.append({"metadata": {}, "spec": {"holderIdentity": holder, "renewTime": renewed}})
    observed = status.observation(children, job.spec.heartbeat, T0)
    hung = [w for w in observed.workers if w.needs_restart]
    assert [(w.name, w.instance) for w in hung] == [("demo-generator-1", "uid-demo-generator-1")]
    assert hung[0].detail == (
        "no heartbeat for 15 s (spec.heartbeat.timeoutSeconds=10): hung, stopped or cut off"
    )
    verdict = decide.decide(job.spec, observed, decide.History())
    (d,) = verdict.decisions
    assert isinstance(d, decide.Restart) and d.worker == "demo-generator-1" and not d.by_platform
    # The decision is in the status the operator writes before it deletes the pod.
    s = status.compute_status(job, 2, children, status.JobStatus(phase="Running"), T0, verdict.history)
    assert (s.restarts, s.replacing) == (1, ["uid-demo-generator-1"])
    assert status.history(s).replacing == {"uid-demo-generator-1"}
    # Without heartbeat settings (or a time) nothing is judged hung.
    assert not any(w.needs_restart for w in status.observation(children).workers)


def test_a_pod_silent_since_its_container_started_is_hung_after_the_startup_timeout() -> None:
    """Found by the chaos soak: a worker hung before its first heartbeat was never judged."""
    job = _job(heartbeat={"intervalSeconds": 2, "timeoutSeconds": 10, "startupTimeoutSeconds": 300})
    children = _running_children()
    for pod in children.pods:
        _running_since(pod, "2026-01-01T11:54:00Z")  # 6 min ago
    _running_since(children.pods[2], "2026-01-01T11:56:00Z")  # trainer-0: 4 min ago, still starting
    children.leases.extend(_beat(p["metadata"]["name"], T0) for p in children.pods[:1])  # only gen-0 beats
    observed = status.observation(children, job.spec.heartbeat, T0)
    hung = {w.name: w.detail for w in observed.workers if w.needs_restart}
    assert set(hung) == {"demo-generator-1", "demo-trainer-1"}, hung
    assert hung["demo-generator-1"] == (
        "no heartbeat in the 359 s since it started (spec.heartbeat.startupTimeoutSeconds=300): "
        "hung while starting"
    )


def test_pods_on_a_node_not_ready_past_the_timeout_are_lost_with_it() -> None:
    """A node whose kubelet is gone: its pods still read Running (or Terminating once evicted), so
    only the node's Ready condition tells; past heartbeat.timeoutSeconds they are replaced."""
    job = _job(heartbeat={"intervalSeconds": 2, "timeoutSeconds": 10})
    children = _running_children()
    for pod in children.pods:
        _running_since(pod, "2026-01-01T11:00:00Z")
        pod["metadata"]["creationTimestamp"] = "2026-01-01T11:00:00Z"
    children.pods[0]["spec"]["nodeName"] = "gpu-2"  # generator-0 alone on the node that goes down
    children.pods[3]["spec"]["nodeName"] = "gpu-2"  # trainer-1 too, already evicted: stuck Terminating
    children.pods[3]["metadata"]["deletionTimestamp"] = "2026-01-01T11:59:58Z"
    children.leases.extend(_beat(p["metadata"]["name"], T0) for p in children.pods)  # all still fresh
    up = health.NodeReadiness("True", T0 - datetime.timedelta(hours=1), "KubeletReady")
    down = health.NodeReadiness("Unknown", T0 - datetime.timedelta(seconds=12), "NodeStatusUnknown")
    children.nodes.update({"gpu-1": up, "gpu-2": down})

    observed = status.observation(children, job.spec.heartbeat, T0)
    lost = [w for w in observed.workers if w.needs_restart]
    assert [(w.name, w.lost_node) for w in lost] == [
        ("demo-generator-0", "gpu-2"),
        ("demo-trainer-1", "gpu-2"),
    ]
    assert lost[0].detail == (
        "its node gpu-2 has not been Ready for 12 s (NodeStatusUnknown) "
        "(spec.heartbeat.timeoutSeconds=10): lost with it"
    )
    verdict = decide.decide(job.spec, observed, decide.History())
    assert [(d.worker, d.lost_node, d.by_platform) for d in verdict.decisions] == [  # type: ignore[union-attr]
        ("demo-trainer-1", "gpu-2", False),
        ("demo-generator-0", "gpu-2", False),
    ]
    assert verdict.decisions[1].reason.startswith("generator demo-generator-0 was lost: its node gpu-2")
    assert verdict.history.restarts == 2

    # Not down long enough, or a pod bound to the node after it went down (it never started there):
    # nothing is lost.
    early = status.observation(children, job.spec.heartbeat, T0 - datetime.timedelta(seconds=3))
    assert not any(w.needs_restart for w in early.workers)
    children.pods[0]["metadata"]["creationTimestamp"] = "2026-01-01T11:59:55Z"
    later = status.observation(children, job.spec.heartbeat, T0)
    assert [w.name for w in later.workers if w.needs_restart] == ["demo-trainer-1"]


def _coordinator_lease(renewed: datetime.datetime, *slow: records.SlowGenerator) -> dict[str, Any]:
    report = records.WorkerReport(
        role=names.TRAINER, progress=records.Progress(step=9, slow_generators=list(slow))
    )
    return {
        "metadata": {"name": "demo-demo-trainer-0", "annotations": records.lease_annotations(report)},
        "spec": {"holderIdentity": "demo-trainer-0", "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
    }


def test_a_generator_rank_0_reports_slow_for_the_replace_time_is_replaced() -> None:
    """Rank 0 says generator-1 has been slow for 130 s (and its work migrated twice): past
    failurePolicy.slowGeneratorReplaceSeconds=120 it is replaced; generator-0, slow for 60 s, is
    not yet; a pod that started after the slow spell began is a replacement, judged afresh."""
    job = _job(
        heartbeat={"intervalSeconds": 2, "timeoutSeconds": 10},
        failurePolicy={"slowGeneratorThreshold": 0.2, "slowGeneratorReplaceSeconds": 120},
    )
    children = _running_children()
    for pod in children.pods:
        _running_since(pod, "2026-01-01T11:00:00Z")
        pod["metadata"]["creationTimestamp"] = "2026-01-01T11:00:00Z"
    children.leases.extend(_beat(p["metadata"]["name"], T0) for p in children.pods)
    slow = records.SlowGenerator(
        generator="demo-generator-1", slow_for_seconds=130, rate=0.5, peers_median=2.0, migrated=6
    )
    early = records.SlowGenerator(
        generator="demo-generator-0", slow_for_seconds=60, rate=0.5, peers_median=2.0
    )
    children.leases.append(_coordinator_lease(T0, slow, early))
    observed = status.observation(children, job.spec.heartbeat, T0, job.spec.failure_policy)
    (w,) = [w for w in observed.workers if w.needs_restart]
    assert (w.name, w.how) == ("demo-generator-1", "stayed slow")
    (d,) = decide.decide(job.spec, observed, decide.History()).decisions
    assert isinstance(d, decide.Restart) and not d.by_platform
    assert d.reason == (
        "generator demo-generator-1 stayed slow: for 130 s: 0.50 rollout groups/s against its peers' "
        "median 2.00 (spec.failurePolicy.slowGeneratorThreshold=0.2, slowGeneratorReplaceSeconds=120); "
        "6 of its leases migrated meanwhile; restart 1/10"
    )
    _running_since(children.pods[1], "2026-01-01T11:58:30Z")  # replaced 90 s ago, in the 130 s spell
    after = status.observation(children, job.spec.heartbeat, T0, job.spec.failure_policy)
    assert not any(w.needs_restart for w in after.workers)


def test_a_renewal_in_the_second_a_container_restarted_is_its_predecessors() -> None:
    """Killed at 11:59:50.4 just after renewing, restarted at once: the kubelet's startedAt says
    11:59:50 (whole seconds), the Lease 11:59:50.3. That renewal is the killed process's, so the
    new one, still starting 10 s later, is not judged hung (found in CI: it was, and counted twice)."""
    job = _job(heartbeat={"intervalSeconds": 1, "timeoutSeconds": 5})
    children = _running_children()
    for pod in children.pods:
        _running_since(pod, "2026-01-01T11:59:50Z")
    children.leases.extend(_beat(p["metadata"]["name"], T0) for p in children.pods[1:])
    children.leases.append(_beat("demo-generator-0", T0 - datetime.timedelta(seconds=9.7)))
    observed = status.observation(children, job.spec.heartbeat, T0)
    assert not any(w.needs_restart for w in observed.workers)
    # One renewal a second later would have been its own: silent 8.5 s since then, it is hung.
    children.leases[-1] = _beat("demo-generator-0", T0 - datetime.timedelta(seconds=8.5))
    hung = [w.name for w in status.observation(children, job.spec.heartbeat, T0).workers if w.needs_restart]
    assert hung == ["demo-generator-0"]


def test_a_renewal_by_the_process_of_a_force_deleted_predecessor_is_not_the_new_pods() -> None:
    """Found in CI: the trainer pods were force-deleted to restart at a new world size; the new
    trainer-0 started at 11:59:49 and the old process, exiting, renewed the Lease once at 11:59:50.
    Taken for the new pod's, that renewal made the new pod "silent for 5 s" while it was still
    loading its model, and it was replaced and counted. The Lease names the pod uid that wrote it."""
    job = _job(heartbeat={"intervalSeconds": 1, "timeoutSeconds": 5})
    children = _running_children()
    for pod in children.pods:
        _running_since(pod, "2026-01-01T11:59:40Z")
    children.leases.extend(_beat(p["metadata"]["name"], T0) for p in children.pods[1:])
    new = _running_since(children.pods[0], "2026-01-01T11:59:49Z")
    late = _beat("demo-generator-0", T0 - datetime.timedelta(seconds=10))  # 11:59:50
    late["metadata"]["annotations"][names.ANNOTATION_POD_UID] = "uid-of-the-pod-before"
    children.leases.append(late)
    observed = status.observation(children, job.spec.heartbeat, T0)
    assert not any(w.needs_restart for w in observed.workers)
    assert _health(children, T0).reason != "HeartbeatTimeout"
    # Written by the new pod itself, the same renewal is its own: silent 10 s, it is hung.
    late["metadata"]["annotations"][names.ANNOTATION_POD_UID] = new["metadata"]["uid"]
    hung = [w.name for w in status.observation(children, job.spec.heartbeat, T0).workers if w.needs_restart]
    assert hung == ["demo-generator-0"]
