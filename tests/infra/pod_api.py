"""What the process runner reads from and posts to the API server, as a kubelet's node identity would
(here: the admin kubeconfig): Secrets, ConfigMaps, claims and their PersistentVolumes, ServiceAccount
tokens bound to the pod (TokenRequest), Services for the environment, the node's allocatable, and the
kubelet's Events about a pod. Implements pod_fs.Lookups (and so pod_env.Lookups).

Neighbours: pod_runner.py (the only user), pod_fs.py / pod_env.py (what the answers become).
"""

from __future__ import annotations

import datetime
import logging
import pathlib
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client import exceptions

from tests.infra import pod_env, pod_fs

log = logging.getLogger("node-agent.api")

Pod = dict[str, Any]


class ApiLookups:
    """What volumes and env read from the API server (admin credentials, as a kubelet's node identity)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self._core = core

    def _missing(self, e: exceptions.ApiException) -> bool:
        return bool(e.status == 404)

    def secret(self, namespace: str, name: str) -> Mapping[str, bytes] | None:
        try:
            s = self._core.read_namespaced_secret(name, namespace)
        except exceptions.ApiException as e:
            if self._missing(e):
                return None
            raise
        return pod_fs.decode_secret(s.data)

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        try:
            cm = self._core.read_namespaced_config_map(name, namespace)
        except exceptions.ApiException as e:
            if self._missing(e):
                return None
            raise
        return dict(cm.data or {})

    def claim_path(self, namespace: str, claim: str) -> str:
        try:
            pvc = self._core.read_namespaced_persistent_volume_claim(claim, namespace)
        except exceptions.ApiException as e:
            if self._missing(e):
                raise pod_fs.VolumeError(f'persistentvolumeclaim "{claim}" not found') from None
            raise
        if (pvc.status.phase if pvc.status else None) != "Bound" or not pvc.spec.volume_name:
            raise pod_fs.VolumeError(f'persistentvolumeclaim "{claim}" is not bound')
        pv = self._core.read_persistent_volume(pvc.spec.volume_name)
        src = pv.spec.host_path or pv.spec.local
        if src is None:
            raise pod_fs.VolumeError(
                f"persistentvolume {pv.metadata.name}: only hostPath and local are supported"
            )
        path = pathlib.Path(src.path)
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def token(self, pod: Pod, audience: str | None, expiration_seconds: int) -> str:
        meta = pod["metadata"]
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[audience] if audience else [],
                expiration_seconds=expiration_seconds,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=meta["name"], uid=meta["uid"]
                ),
            )
        )
        sa = pod["spec"].get("serviceAccountName") or "default"
        status = self._core.create_namespaced_service_account_token(sa, meta["namespace"], request).status
        return str(status.token)

    def services(self, namespace: str, links: bool) -> list[pod_env.Service]:
        def conv(svc: Any) -> pod_env.Service:
            ports = tuple((p.name or "", int(p.port), p.protocol or "TCP") for p in svc.spec.ports or [])
            return pod_env.Service(svc.metadata.name, svc.spec.cluster_ip or "", ports)

        out = [conv(self._core.read_namespaced_service("kubernetes", "default"))]
        if links:
            out += [conv(s) for s in self._core.list_namespaced_service(namespace).items]
        return out

    def allocatable(self, node: str) -> dict[str, str]:
        n = self._core.read_node(node)
        return dict((n.status.allocatable if n.status else None) or {})

    def event(self, pod: Pod, container: str | None, kind: str, reason: str, message: str) -> None:
        """A Pod event as a kubelet posts it (best effort)."""
        meta = pod["metadata"]
        stamp = datetime.datetime.now(datetime.UTC)
        ref = client.V1ObjectReference(
            kind="Pod", api_version="v1", name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
            field_path=f"spec.containers{{{container}}}" if container else None,
        )  # fmt: skip
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}."),
            involved_object=ref,
            reason=reason,
            message=message,
            type=kind,
            first_timestamp=stamp,
            last_timestamp=stamp,
            count=1,
            source=client.V1EventSource(component="kubelet", host=pod["spec"].get("nodeName")),
        )
        try:
            self._core.create_namespaced_event(meta["namespace"], body)
        except Exception as err:  # events are best effort, as in a kubelet
            log.debug("event %s for %s: %s", reason, meta["name"], err)
