"""Fake GPU nodes: Node objects that look like a GPU machine to the scheduler (capacity, allocatable,
GPU-feature-discovery labels, taints, Ready), with no kubelet behind them.

node_agent.py plays kubelet for pods bound to them, with the runner the node's `plrl.dev/runner` label
names (`status` by default: nothing runs; `process`: containers run as local processes). Their address
is loopback: the API server reaches "the kubelet" (`kubectl logs`) at the node agent's log endpoint,
whose port the agent writes into status.daemonEndpoints.

Neighbours: node_agent.py (recognises these nodes by FAKE_NODE_LABEL), tests/conftest.py (the
`gpu_nodes` fixture), controlplane.py (the cluster they are created in).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
import uuid
from typing import Any

from kubernetes import client
from kubernetes.client import exceptions

from tests.infra import kube

FAKE_NODE_LABEL = "plrl.dev/fake-node"
RUNNER_LABEL = "plrl.dev/runner"  # which PodRunner of the node agent plays kubelet here: status | process
POOL_LABEL = "plrl.dev/pool"  # set by the gpu_nodes fixture: one value per group of nodes a test makes
# Added by the TaintNodesByCondition admission plugin to every new Node, and lifted by the node lifecycle
# controller once the node is Ready. Our control plane runs neither; create() still lifts it, for a
# cluster that has the plugin on.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# What the node lifecycle controller taints a node with once its kubelet stopped posting status.
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
# The kubelet port a new node advertises; the node agent replaces it with its log endpoint's port.
KUBELET_PORT = 10250


@dataclasses.dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclasses.dataclass(frozen=True)
class GpuNode:
    """One fake GPU machine. Defaults: an 8 x H100 node."""

    name: str
    gpus: int = 8
    resource_name: str = "nvidia.com/gpu"
    product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110
    runner: str = "status"
    """`status`: pods are only reported Running; `process`: their containers really run (pod_runner.py)."""


@dataclasses.dataclass(frozen=True)
class Pool:
    """A group of fake nodes made together: `name` is their POOL_LABEL value."""

    name: str
    nodes: tuple[str, ...]

    @classmethod
    def fresh(cls, count: int) -> Pool:
        # A leading letter: an all-hex name like 1234e567 is a float to Go's YAML parser.
        name = "p" + uuid.uuid4().hex[:7]
        return cls(name, tuple(f"gpu-{name}-{i}" for i in range(count)))


def manifest(node: GpuNode, now: datetime.datetime | None = None) -> dict[str, Any]:
    """The Node object, status included (the API server keeps status given at create)."""
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {
        "cpu": node.cpu,
        "memory": node.memory,
        "pods": str(node.pods),
        "ephemeral-storage": "1Ti",
        node.resource_name: str(node.gpus),
    }
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "fake-gpu",
        FAKE_NODE_LABEL: "true",
        RUNNER_LABEL: node.runner,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": node.product,
        "nvidia.com/gpu.count": str(node.gpus),
        "nvidia.com/gpu.memory": str(node.gpu_memory_mib),
        **node.labels,
    }
    conditions = [
        {
            "type": t,
            "status": "False",
            "reason": f"No{t}",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    conditions.append(
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "fake node managed by the plrl node agent",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": {"taints": [dataclasses.asdict(t) for t in node.taints]},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": node.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v0.0.0-fake",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "plrl-node-agent://0",
                "osImage": "fake",
                "kernelVersion": "fake",
                "machineID": node.name,
                "systemUUID": node.name,
                "bootID": node.name,
            },
        },
    }


def without_not_ready(taints: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [t for t in taints or [] if t.get("key") != NOT_READY_TAINT]


def create(core: client.CoreV1Api, nodes: list[GpuNode], timeout_s: float = 30.0) -> list[str]:
    """Creates the nodes (a kubernetes.client.CoreV1Api) and lifts the not-ready taint the API server
    adds on create, so the scheduler sees them schedulable. Returns their names."""
    for node in nodes:
        core.create_node(kube.model(client.V1Node, manifest(node)))
    for node in nodes:
        deadline = time.monotonic() + timeout_s
        while True:
            current = core.read_node(node.name)
            spec = current.spec or client.V1NodeSpec()
            taints = [t.to_dict() for t in spec.taints or []]
            kept = without_not_ready(taints)
            if kept == taints:
                break
            # A strategic-merge patch of a list without a merge key replaces it whole.
            core.patch_node(node.name, {"spec": {"taints": kept or None}})
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node.name}: could not lift the {NOT_READY_TAINT} taint")
    return [n.name for n in nodes]


def delete(core: client.CoreV1Api, names: list[str]) -> None:
    for name in names:
        try:
            core.delete_node(name)
        except exceptions.ApiException as e:
            if e.status != 404:
                raise


def ready(node: client.V1Node) -> str | None:
    """The node's Ready condition status ("True", "False", "Unknown"), None if it has none."""
    for c in (node.status.conditions if node.status else None) or []:
        if c.type == "Ready":
            return str(c.status)
    return None


def lose(core: client.CoreV1Api, name: str) -> None:
    """Take a fake node down as a lost machine looks to the cluster: what the node lifecycle
    controller (not run here) does once a kubelet stops posting. Ready becomes Unknown, and the node
    is tainted unreachable (NoSchedule keeps new pods off it; NoExecute is what an eviction of its
    pods would follow). The node agent then powers its pods off and reports nothing more for them."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }
    core.patch_node_status(name, {"status": {"conditions": [condition]}})  # merged by type
    node = core.read_node(name)
    kept = [
        {"key": t.key, "value": t.value, "effect": t.effect}
        for t in (node.spec.taints if node.spec else None) or []
        if t.key != UNREACHABLE_TAINT
    ]
    added = [{"key": UNREACHABLE_TAINT, "effect": e, "timeAdded": stamp} for e in ("NoSchedule", "NoExecute")]
    # A strategic-merge patch of a list without a merge key replaces it whole.
    core.patch_node(name, {"spec": {"taints": kept + added}})
