"""The local control plane behaves like a real cluster in the ways the operator relies on.

Cases: RBAC is enforced for a ServiceAccount token from the TokenRequest API (refused, then allowed in
its namespace after a RoleBinding, still refused cluster-wide); a StatefulSet with GPU requests is
scheduled onto the fake GPU nodes within their capacity, becomes Running/Ready, and its pods are gone
after it is deleted; a pod asking for more GPUs than any node has stays Pending with FailedScheduling;
the garbage collector removes owned objects with their owner; helm and kubectl talk to the cluster.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.infra import controlplane, kube, nodes, tokens, tools

pytestmark = pytest.mark.cluster


def eventually(check: Callable[[], Any], timeout_s: float = 60.0, what: str = "condition") -> Any:
    """Polls check() until it returns something truthy; fails with `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


def test_rbac_enforced_for_service_account_token(
    core_api: client.ApiClient,
    namespace: str,
    kubectl: tools.Tool,
    control_plane: controlplane.Cluster,
    tmp_path: pathlib.Path,
) -> None:
    core = client.CoreV1Api(core_api)
    sa = kube.model(client.V1ServiceAccount, {"metadata": {"name": "reader"}})
    core.create_namespaced_service_account(namespace, sa)
    token = tokens.service_account_token(core, namespace, "reader")
    as_reader = str(tokens.token_kubeconfig(control_plane.kubeconfig, token, tmp_path / "reader.kubeconfig"))

    denied = kubectl("--kubeconfig", as_reader, "get", "secrets", "-A", check=False)
    assert denied.returncode != 0
    assert f'User "system:serviceaccount:{namespace}:reader" cannot list resource "secrets"' in denied.stderr
    assert kubectl("--kubeconfig", as_reader, "get", "secrets", "-n", namespace, check=False).returncode != 0

    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "secret-reader"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "reader-reads-secrets"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secret-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    }
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all([role, binding]))
    # The authorizer reads RBAC objects from an informer: allow it a moment to see the binding.
    eventually(
        lambda: (
            kubectl("--kubeconfig", as_reader, "get", "secrets", "-n", namespace, check=False).returncode == 0
        ),
        timeout_s=15,
        what="the RoleBinding to take effect",
    )
    still = kubectl("--kubeconfig", as_reader, "get", "secrets", "-A", check=False)
    assert "cannot list resource" in still.stderr


def _gpu_statefulset(name: str, pool: str, replicas: int, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {nodes.POOL_LABEL: pool},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {
                            "name": "worker",
                            "image": "plrl/worker:test",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def _pods(kubectl: tools.Tool, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    )["items"]
    return items


def test_gpu_statefulset_scheduled_within_capacity_and_running(
    gpu_nodes: Callable[..., nodes.Pool], kubectl: tools.Tool, namespace: str
) -> None:
    gpu_taint = nodes.Taint("nvidia.com/gpu", "present", "NoSchedule")
    pool = gpu_nodes(2, gpus=8, taints=(gpu_taint,))
    sts = _gpu_statefulset("trainer", pool.name, replicas=3, gpus=4)
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(sts))

    def all_ready() -> bool:
        status = json.loads(kubectl("get", "statefulset", "trainer", "-n", namespace, "-o", "json").stdout)[
            "status"
        ]
        return bool(status.get("readyReplicas") == 3)

    eventually(all_ready, what="3 ready replicas")
    pods = _pods(kubectl, namespace, "app=trainer")
    assert sorted(p["metadata"]["name"] for p in pods) == ["trainer-0", "trainer-1", "trainer-2"]
    assert all(p["status"]["phase"] == "Running" for p in pods)
    per_node = [sum(p["spec"]["nodeName"] == n for p in pods) for n in pool.nodes]
    assert sorted(per_node) == [1, 2], "3 pods x 4 GPUs on 2 nodes x 8 GPUs must split 2 + 1"

    kubectl("delete", "statefulset", "trainer", "-n", namespace, "--wait=false")
    eventually(
        lambda: not _pods(kubectl, namespace, "app=trainer"), what="the StatefulSet's pods to be deleted"
    )


def test_pod_asking_too_many_gpus_stays_pending(
    gpu_nodes: Callable[..., nodes.Pool], kubectl: tools.Tool, namespace: str
) -> None:
    pool = gpu_nodes(1, gpus=8).name
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "greedy", "labels": {"app": "greedy"}},
        "spec": {
            "nodeSelector": {nodes.POOL_LABEL: pool},
            "containers": [
                {"name": "w", "image": "plrl/worker:test", "resources": {"limits": {"nvidia.com/gpu": "16"}}}
            ],
        },
    }
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))

    def failed_scheduling() -> list[dict[str, Any]]:
        out = kubectl(
            "get", "events", "-n", namespace, "--field-selector", "reason=FailedScheduling", "-o", "json"
        )
        return [e for e in json.loads(out.stdout)["items"] if e["involvedObject"]["name"] == "greedy"]

    events = eventually(failed_scheduling, what="a FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in events[0]["message"]
    got = json.loads(kubectl("get", "pod", "greedy", "-n", namespace, "-o", "json").stdout)
    assert got["status"]["phase"] == "Pending"
    scheduled = next(c for c in got["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")


def test_deleting_owner_garbage_collects_owned(core_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(core_api)

    def config_map(name: str, owners: list[dict[str, str]]) -> client.V1ConfigMap:
        doc = {"metadata": {"name": name, "ownerReferences": owners}}
        return core.create_namespaced_config_map(namespace, kube.model(client.V1ConfigMap, doc))

    owner = config_map("owner", [])
    assert owner.metadata is not None and owner.metadata.uid
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    for i in range(3):
        config_map(f"owned-{i}", [ref])
    config_map("bystander", [])

    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    def remaining() -> set[str]:
        items = core.list_namespaced_config_map(namespace).items
        return {cm.metadata.name for cm in items if cm.metadata and cm.metadata.name}

    eventually(
        lambda: not remaining() & {"owned-0", "owned-1", "owned-2"}, what="owned ConfigMaps to be collected"
    )
    assert "bystander" in remaining()


def test_helm_and_kubectl_talk_to_the_cluster(
    helm: tools.Tool, kubectl: tools.Tool, namespace: str, tmp_path: pathlib.Path
) -> None:
    assert helm("version", "--short").stdout.startswith("v3.22.0")
    versions = json.loads(kubectl("version", "-o", "json").stdout)
    assert versions["serverVersion"]["gitVersion"] == "v1.37.2"
    assert versions["clientVersion"]["minor"] == "37"

    chart = tmp_path / "hello"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: hello\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\ndata:\n  greeting: hi\n"
    )
    helm("install", "hi", str(chart), "-n", namespace)
    assert json.loads(kubectl("get", "configmap", "hi-cm", "-n", namespace, "-o", "json").stdout)["data"] == {
        "greeting": "hi"
    }
    releases = json.loads(helm("list", "-n", namespace, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [("hi", "deployed")]
