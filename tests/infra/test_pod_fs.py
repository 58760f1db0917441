"""pod_fs: a pod's volumes on the host and each container's mounts.

Cases: the operator's worker pod (ConfigMap at /etc/plrl read-only, memory emptyDir at /dev/shm,
PVCs through their PV's host path, the ServiceAccount's projected volume with token, CA and namespace);
ConfigMap `items`, modes and `optional`; a missing ConfigMap or unbound claim fails (FailedMount);
subPath; the kubelet's own files (/etc/hosts, /etc/hostname, /etc/resolv.conf, termination log) are
added unless the container mounts one itself; `write` creates directories and files atomically.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import pytest

from tests.infra import pod_env, pod_fs

FACTS = pod_env.PodFacts(pod_ip="198.18.0.7", host_ip="127.0.0.1")


class Lookups:
    def __init__(self, tmp: pathlib.Path) -> None:
        self.tmp = tmp
        self.tokens: list[tuple[str | None, int]] = []

    def secret(self, namespace: str, name: str) -> Mapping[str, bytes] | None:
        return {"token": b"s3cret"} if name == "tok" else None

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return {
            "job-config": {"trainer.json": "{}", "generator.json": "{}"},
            "kube-root-ca.crt": {"ca.crt": "CA"},
        }.get(name)

    def claim_path(self, namespace: str, claim: str) -> str:
        if claim == "unbound":
            raise pod_fs.VolumeError(f'persistentvolumeclaim "{claim}" is not bound')
        return str(self.tmp / "pv" / claim)

    def token(self, pod: dict[str, Any], audience: str | None, expiration_seconds: int) -> str:
        self.tokens.append((audience, expiration_seconds))
        return "jwt"


def _worker_pod(volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "job-train-0", "namespace": "ns", "uid": "u"},
        "spec": {
            "volumes": volumes
            if volumes is not None
            else [
                {"name": "config", "configMap": {"name": "job-config"}},
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
                {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}},
                {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
                {
                    "name": "kube-api-access-x",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                                    ]
                                }
                            },
                        ],
                    },
                },
            ]
        },
    }


def test_the_operators_worker_pod(tmp_path: pathlib.Path) -> None:
    lookups = Lookups(tmp_path)
    pod_dir = tmp_path / "pod"
    plan = pod_fs.plan_volumes(_worker_pod(), pod_dir, lookups, FACTS)
    assert plan.dirs["config"] == pod_dir / "volumes" / "config"
    assert plan.dirs["checkpoints"] == tmp_path / "pv" / "ckpt"
    assert plan.tmpfs == [pod_dir / "volumes" / "dshm"]
    assert plan.read_only == {"config", "model", "kube-api-access-x"}
    sa = pod_dir / "volumes" / "kube-api-access-x"
    assert plan.files[sa / "token"] == (b"jwt", 420)
    assert plan.files[sa / "ca.crt"] == (b"CA", 420)
    assert plan.files[sa / "namespace"] == (b"ns", 420)
    assert plan.files[pod_dir / "volumes" / "config" / "trainer.json"] == (b"{}", 0o644)
    assert lookups.tokens == [(None, 3607)] and plan.tokens[0].path == sa / "token"

    pod_fs.write(plan)
    assert (sa / "token").read_text() == "jwt" and (sa / "token").stat().st_mode & 0o777 == 420
    files = pod_fs.PodFiles(tmp_path / "hosts", tmp_path / "hostname", tmp_path / "resolv.conf")
    container = {
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/plrl", "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "checkpoints", "mountPath": "/checkpoints"},
            {"name": "model", "mountPath": "/models"},
            {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ]
    }
    mounts = {m.target: m for m in pod_fs.container_mounts(container, plan, files, tmp_path / "term")}
    assert mounts["/etc/plrl"].read_only and mounts["/models"].read_only
    assert not mounts["/checkpoints"].read_only and not mounts["/dev/shm"].read_only
    assert mounts["/var/run/secrets/kubernetes.io/serviceaccount"].read_only
    assert mounts["/etc/hosts"].source == str(tmp_path / "hosts")
    assert mounts["/dev/termination-log"].source == str(tmp_path / "term")
    assert set(mounts) >= {"/etc/hostname", "/etc/resolv.conf"}


def test_items_modes_and_optional_objects(tmp_path: pathlib.Path) -> None:
    item = {"key": "trainer.json", "path": "t/x.json", "mode": 0o600}
    vols = [
        {"name": "a", "configMap": {"name": "job-config", "items": [item]}},
        {"name": "b", "secret": {"secretName": "tok", "defaultMode": 0o400}},
        {"name": "c", "secret": {"secretName": "gone", "optional": True}},
    ]
    plan = pod_fs.plan_volumes(_worker_pod(vols), tmp_path, Lookups(tmp_path), FACTS)
    assert plan.files == {
        tmp_path / "volumes" / "a" / "t" / "x.json": (b"{}", 0o600),
        tmp_path / "volumes" / "b" / "token": (b"s3cret", 0o400),
    }


@pytest.mark.parametrize(
    ("volume", "message"),
    [
        ({"name": "x", "configMap": {"name": "gone"}}, 'configmap "gone" not found'),
        ({"name": "x", "persistentVolumeClaim": {"claimName": "unbound"}},
         'persistentvolumeclaim "unbound" is not bound'),
        ({"name": "x", "iscsi": {}}, r"volume x: unsupported volume type \['iscsi'\]"),
    ],
)  # fmt: skip
def test_volumes_that_cannot_be_set_up_yet(
    tmp_path: pathlib.Path, volume: dict[str, Any], message: str
) -> None:
    with pytest.raises(pod_fs.VolumeError, match=message):
        pod_fs.plan_volumes(_worker_pod([volume]), tmp_path, Lookups(tmp_path), FACTS)


def test_sub_path_and_own_hosts_file(tmp_path: pathlib.Path) -> None:
    plan = pod_fs.plan_volumes(
        _worker_pod([{"name": "data", "emptyDir": {}}]), tmp_path, Lookups(tmp_path), FACTS
    )
    files = pod_fs.PodFiles(tmp_path / "hosts", tmp_path / "hostname", tmp_path / "resolv.conf")
    container = {
        "volumeMounts": [
            {"name": "data", "mountPath": "/data/run1", "subPath": "run1"},
            {"name": "data", "mountPath": "/etc/hosts", "subPath": "hosts"},
        ],
        "terminationMessagePath": "/tmp/why",
    }
    mounts = {m.target: m.source for m in pod_fs.container_mounts(container, plan, files, tmp_path / "t")}
    assert mounts["/data/run1"] == str(tmp_path / "volumes" / "data" / "run1")
    assert (tmp_path / "volumes" / "data" / "run1").is_dir()
    assert mounts["/etc/hosts"] == str(tmp_path / "volumes" / "data" / "hosts")
    assert mounts["/tmp/why"] == str(tmp_path / "t") and "/dev/termination-log" not in mounts
