"""The node agent's pure parts: the status it writes for a pod, and when it decides a write is needed.

Cases: a running pod is Ready with one running status per container and its init containers
Completed; a second pass with a later clock needs no write (no API churn) and keeps timestamps; a
terminated container flips Ready off and needs a write; pod IPs are stable per uid and never loopback
(EndpointSlices refuse loopback); fake node manifests carry GPU capacity and loopback addresses.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from tests.infra import node_agent, nodes


def _pod(
    uid: str = "6f1c3c1e-0000-4000-8000-000000000001", status: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "trainer-0", "namespace": "ns", "uid": uid},
        "spec": {
            "nodeName": "gpu-a-0",
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "containers": [{"name": "worker", "image": "plrl/worker"}, {"name": "sidecar", "image": "x"}],
        },
        "status": status or {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
    }


def _ready(status: dict[str, Any]) -> str:
    return str(next(c["status"] for c in status["conditions"] if c["type"] == "Ready"))


def test_running_pod_status_is_ready_with_every_container_running() -> None:
    pod = _pod()
    status = node_agent.pod_status(
        pod, node_agent.StatusOnlyRunner().sync(pod), "127.0.0.1", "2026-01-01T00:00:00Z"
    )
    assert status["phase"] == "Running"
    assert _ready(status) == "True"
    assert [(c["name"], list(c["state"])) for c in status["containerStatuses"]] == [
        ("worker", ["running"]),
        ("sidecar", ["running"]),
    ]
    assert status["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


def test_second_pass_needs_no_write_and_keeps_timestamps() -> None:
    runner = node_agent.StatusOnlyRunner()
    first = node_agent.pod_status(_pod(), runner.sync(_pod()), "127.0.0.1", "2026-01-01T00:00:00Z")
    again_pod = _pod(status=first)
    second = node_agent.pod_status(again_pod, runner.sync(again_pod), "127.0.0.1", "2026-01-01T00:05:00Z")
    assert node_agent.summary(second) == node_agent.summary(first)
    assert second["startTime"] == "2026-01-01T00:00:00Z"
    assert second["containerStatuses"][0]["state"]["running"]["startedAt"] == "2026-01-01T00:00:00Z"


def test_exited_container_turns_ready_off_and_needs_a_write() -> None:
    runner = node_agent.StatusOnlyRunner()
    running = node_agent.pod_status(_pod(), runner.sync(_pod()), "127.0.0.1", "2026-01-01T00:00:00Z")
    state = node_agent.PodState(
        phase="Failed",
        pod_ip=running["podIP"],
        containers=(
            node_agent.ContainerState("worker", "plrl/worker", "terminated", False, 137, "OOMKilled"),
        ),
    )
    failed = node_agent.pod_status(_pod(status=running), state, "127.0.0.1", "2026-01-01T00:01:00Z")
    assert _ready(failed) == "False"
    assert failed["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert node_agent.summary(failed) != node_agent.summary(running)


def test_pod_ips_are_stable_per_uid_and_not_loopback() -> None:
    uids = [f"6f1c3c1e-0000-4000-8000-{i:012x}" for i in range(200)]
    ips = [node_agent.StatusOnlyRunner.pod_ip(u) for u in uids]
    assert ips == [node_agent.StatusOnlyRunner.pod_ip(u) for u in uids]
    assert len(set(ips)) == len(ips)
    assert not any(ipaddress.ip_address(ip).is_loopback for ip in ips)


def test_fake_node_manifest_has_gpu_capacity_labels_and_loopback_address() -> None:
    node = nodes.GpuNode("gpu-a-0", gpus=4, resource_name="amd.com/gpu", taints=(nodes.Taint("gpu", "yes"),))
    doc = nodes.manifest(node)
    assert doc["status"]["allocatable"]["amd.com/gpu"] == "4"
    assert doc["metadata"]["labels"]["nvidia.com/gpu.count"] == "4"
    assert doc["spec"]["taints"] == [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]
    assert {a["address"] for a in doc["status"]["addresses"] if a["type"] == "InternalIP"} == {"127.0.0.1"}


def test_a_crash_annotated_pod_is_reported_as_a_kubelet_reports_a_crash_loop() -> None:
    now = [100.0]
    runner = node_agent.StatusOnlyRunner(crash_period_s=1.0, clock=lambda: now[0])
    pod = _pod()
    pod["metadata"]["annotations"] = {node_agent.StatusOnlyRunner.CRASH_ANNOTATION: "3"}
    first = node_agent.pod_status(pod, runner.sync(pod), "127.0.0.1", "2026-01-01T00:00:00Z")
    worker = first["containerStatuses"][0]
    assert worker["state"] == {"waiting": {"reason": "CrashLoopBackOff"}} and _ready(first) == "False"
    assert worker["restartCount"] == 1 and worker["lastState"]["terminated"]["exitCode"] == 3
    now[0] += 2.5
    later = node_agent.pod_status(
        _pod(status=first) | {"metadata": pod["metadata"]},
        runner.sync(pod),
        "127.0.0.1",
        "2026-01-01T00:00:03Z",
    )
    assert later["containerStatuses"][0]["restartCount"] == 3
    assert node_agent.summary(later) != node_agent.summary(first)  # a new restart is written


def test_what_a_process_runner_knows_reaches_the_status() -> None:
    """Times, messages and lastState from a runner that really ran the container; a change of the
    waiting reason alone (ContainerCreating -> CrashLoopBackOff) needs a write; no address: no podIP."""
    crashed = node_agent.ContainerState(
        "worker",
        "plrl/worker",
        "waiting",
        False,
        reason="CrashLoopBackOff",
        restart_count=2,
        last_exit_code=2,
        last_reason="Error",
        last_message="plrl-worker: bad model",
        message="back-off 20s restarting failed container=worker",
        last_started_at="2026-01-01T00:00:01Z",
        last_finished_at="2026-01-01T00:00:03Z",
    )
    pod = _pod()
    state = node_agent.PodState("Running", "198.18.0.9", (crashed,))
    status = node_agent.pod_status(pod, state, "127.0.0.1", "2026-01-01T00:01:00Z")
    c = status["containerStatuses"][0]
    assert c["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": crashed.message}}
    assert c["lastState"]["terminated"] == {
        "exitCode": 2,
        "reason": "Error",
        "message": "plrl-worker: bad model",
        "startedAt": "2026-01-01T00:00:01Z",
        "finishedAt": "2026-01-01T00:00:03Z",
    }
    creating = node_agent.ContainerState(
        "worker", "plrl/worker", "waiting", False, reason="ContainerCreating"
    )
    before = node_agent.pod_status(pod, node_agent.PodState("Pending", "", (creating,)), "127.0.0.1", "t")
    assert before["podIP"] is None and _ready(before) == "False"
    assert (
        next(x for x in before["conditions"] if x["type"] == "PodReadyToStartContainers")["status"] == "False"
    )
    assert node_agent.summary(before) != node_agent.summary(status)
