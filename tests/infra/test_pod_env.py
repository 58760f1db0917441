"""pod_env: a container's environment and command line as a kubelet builds them.

Cases: layers (image ENV < Service env < envFrom < env); `$(VAR)` expansion of earlier variables, `$$`
escaping and undefined references left alone; the downward API (name, namespace, uid, a label such as
the StatefulSet pod index, the pod IP); resourceFieldRef with a divisor and a missing limit read from
the node; secretKeyRef / configMapKeyRef, with the kubelet's messages for a missing object or key and
`optional` skipping them; Service links for ClusterIP Services only; command/args falling back to the
image's entrypoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tests.infra import pod_env

IMAGE = pod_env.Image(env={"PATH": "/venv/bin:/usr/bin", "OMP_NUM_THREADS": "1"}, entrypoint=("plrl-worker",))
FACTS = pod_env.PodFacts(pod_ip="198.18.0.7", host_ip="127.0.0.1")
KUBERNETES = pod_env.Service("kubernetes", "10.0.0.1", (("https", 443, "TCP"),))


class Lookups:
    def __init__(self) -> None:
        self.secrets = {"tok": {"token": b"s3cret"}}
        self.maps = {"cfg": {"level": "debug", "mode": "fast"}}

    def secret(self, namespace: str, name: str) -> Mapping[str, bytes] | None:
        return self.secrets.get(name)

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self.maps.get(name)


def _pod(**container: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    c = {"name": "trainer", "image": "x", **container}
    pod = {
        "metadata": {
            "name": "job-train-1",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {"apps.kubernetes.io/pod-index": "1"},
        },
        "spec": {"nodeName": "gpu-0", "serviceAccountName": "job-worker", "containers": [c]},
    }
    return pod, c


def _env(**container: Any) -> dict[str, str]:
    pod, c = _pod(**container)
    return pod_env.container_env(pod, c, IMAGE, [KUBERNETES], Lookups(), FACTS, {"cpu": "64"})


def test_layers_and_the_downward_api() -> None:
    env = _env(
        env=[
            {"name": "PLRL_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "PLRL_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {
                "name": "PLRL_POD_INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}},
            },
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "OMP_NUM_THREADS", "value": "2"},
        ]
    )
    assert env["PLRL_POD_NAME"] == "job-train-1" and env["PLRL_NAMESPACE"] == "ns"
    assert env["PLRL_POD_INDEX"] == "1" and env["IP"] == "198.18.0.7"
    assert env["PATH"] == "/venv/bin:/usr/bin" and env["OMP_NUM_THREADS"] == "2"  # env beats the image
    assert env["KUBERNETES_SERVICE_HOST"] == "10.0.0.1" and env["KUBERNETES_SERVICE_PORT"] == "443"
    assert env["KUBERNETES_PORT"] == "tcp://10.0.0.1:443"
    assert env["HOSTNAME"] == "job-train-1"


def test_references_expand_earlier_variables_only() -> None:
    env = _env(
        env=[
            {"name": "A", "value": "a"},
            {"name": "B", "value": "$(A)-$(C)-$$(A)-$(KUBERNETES_SERVICE_HOST)"},
            {"name": "C", "value": "c"},
        ]
    )
    assert env["B"] == "a-$(C)-$(A)-10.0.0.1"


def test_secret_and_config_map_keys() -> None:
    env = _env(
        env=[
            {"name": "PLRL_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "level"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}},
        ],
        envFrom=[{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
    )
    assert env["PLRL_TOKEN"] == "s3cret" and env["LEVEL"] == "debug"
    assert env["CFG_mode"] == "fast" and "OPT" not in env


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ({"secretKeyRef": {"name": "nope", "key": "token"}}, 'secret "nope" not found'),
        ({"secretKeyRef": {"name": "tok", "key": "other"}}, "couldn't find key other in Secret ns/tok"),
        ({"configMapKeyRef": {"name": "nope", "key": "k"}}, 'configmap "nope" not found'),
        ({"configMapKeyRef": {"name": "cfg", "key": "k"}}, "couldn't find key k in ConfigMap ns/cfg"),
        ({"fieldRef": {"fieldPath": "spec.nope"}}, "unsupported fieldRef fieldPath 'spec.nope'"),
    ],
)
def test_missing_references_fail_with_the_kubelets_message(ref: dict[str, Any], message: str) -> None:
    with pytest.raises(pod_env.EnvError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        _env(env=[{"name": "X", "valueFrom": ref}])


def test_resource_field_refs() -> None:
    env = _env(
        resources={"requests": {"memory": "1Gi", "cpu": "500m"}, "limits": {"memory": "2Gi"}},
        env=[
            {
                "name": "MEM",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
            {"name": "REQ_CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
            {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
    )
    assert (env["MEM"], env["REQ_CPU"], env["CPUS"]) == ("2048", "1", "64")


def test_service_links_skip_headless_services() -> None:
    out = pod_env.service_env(
        [KUBERNETES, pod_env.Service("job-train", "None", (("rpc", 50051, "TCP"),)),
         pod_env.Service("my-svc", "10.0.0.9", (("http", 80, "TCP"), ("", 81, "UDP")))]
    )  # fmt: skip
    assert not any(k.startswith("JOB_TRAIN") for k in out)
    assert out["MY_SVC_SERVICE_HOST"] == "10.0.0.9" and out["MY_SVC_SERVICE_PORT_HTTP"] == "80"
    assert out["MY_SVC_PORT_81_UDP"] == "udp://10.0.0.9:81"


def test_command_line() -> None:
    env = {"ROLE": "trainer"}
    assert pod_env.command_line({"command": ["plrl-worker", "--role", "$(ROLE)"]}, IMAGE, env) == [
        "plrl-worker",
        "--role",
        "trainer",
    ]
    assert pod_env.command_line({"args": ["--role", "$(ROLE)"]}, IMAGE, env) == [
        "plrl-worker",
        "--role",
        "trainer",
    ]
    assert pod_env.command_line({}, pod_env.Image(env={}), env) == []
