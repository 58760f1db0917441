"""The operator's only Kubernetes API I/O: list a job's children, apply what differs, patch status.

Blocking calls over the `kubernetes` package's HTTP client (handlers run them in a thread). Writes
are server-side apply with one field manager and `force` (the operator owns these objects), and
happen only for objects whose `pipelinerl.io/desired-hash` differs from the live one, or that
are missing; create-only objects (the token Secret) are created once and never patched. Every
request is counted in `metrics` by verb and kind, which is how tests prove "no needless writes".

Neighbours: `plrl_operator.render` (desired objects), `plrl_operator.handlers` (the caller),
`plrl_operator.metrics` (request counters).
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import json
import logging
import urllib.parse
from typing import Any

import kubernetes

from plrl_api import names
from plrl_api import spec as spec_mod
from plrl_operator import metrics


@dataclasses.dataclass(frozen=True)
class Kind:
    group_version: str  # "v1" or "apps/v1"
    plural: str

    def collection(self, namespace: str) -> str:
        prefix = "/api/" if "/" not in self.group_version else "/apis/"
        return f"{prefix}{self.group_version}/namespaces/{namespace}/{self.plural}"


# Every kind render produces, in apply order (dependencies first).
CHILD_KINDS: dict[str, Kind] = {
    "ConfigMap": Kind("v1", "configmaps"),
    "Secret": Kind("v1", "secrets"),
    "ServiceAccount": Kind("v1", "serviceaccounts"),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "rolebindings"),
    "Service": Kind("v1", "services"),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies"),
    "StatefulSet": Kind("apps/v1", "statefulsets"),
}
LOG = logging.getLogger(__name__)
# Write order between kinds (lower first); kinds not listed are level 0.
WRITE_LEVEL = {"StatefulSet": 1}
JOB_KIND = Kind(f"{spec_mod.API_GROUP}/{spec_mod.API_VERSION}", spec_mod.PLURAL)
POD_KIND = Kind("v1", "pods")
LEASE_KIND = Kind("coordination.k8s.io/v1", "leases")


class ApiError(Exception):
    """A failed request: the HTTP status and the API server's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def _live_hash(obj: dict[str, Any] | None) -> str | None:
    if obj is None:
        return None
    value = obj.get("metadata", {}).get("annotations", {}).get(names.ANNOTATION_DESIRED_HASH)
    return str(value) if value is not None else None


def needs_write(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """Pure: whether `desired` must be written, given the live object (None: absent)."""
    if live is None:
        return True
    if names.ANNOTATION_CREATE_ONLY in desired["metadata"].get("annotations", {}):
        return False
    return _live_hash(live) != _live_hash(desired)


class Client:
    """Raw JSON requests with the credentials of a kubeconfig or the pod's ServiceAccount."""

    def __init__(self, api: kubernetes.client.ApiClient, field_manager: str, parallelism: int = 8) -> None:
        self.api = api
        self.field_manager = field_manager
        # Independent requests of one reconcile (the lists; the writes of one dependency level) go
        # out together: a reconcile then costs ~3 round trips instead of ~16.
        self.pool = concurrent.futures.ThreadPoolExecutor(parallelism, thread_name_prefix="k8s")

    @staticmethod
    def from_environment(field_manager: str) -> Client:
        """In-cluster credentials if running in a pod, else $KUBECONFIG / ~/.kube/config."""
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        config = kubernetes.client.Configuration.get_default_copy()
        config.connection_pool_maxsize = 16  # at least the thread pool's size: no connection churn
        return Client(kubernetes.client.ApiClient(config), field_manager)

    def request(
        self,
        method: str,
        path: str,
        *,
        kind: str,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        metrics.API_REQUESTS.labels(verb=method, kind=kind).inc()
        if method != "GET":
            LOG.info("write: %s %s %s", method, kind, path)  # one line per write, with its namespace
        url_path = path + ("?" + urllib.parse.urlencode(query) if query else "")
        m, url, headers, data, _ = self.api.param_serialize(
            method,
            url_path,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(m, url, header_params=headers, body=data, _request_timeout=30)
        raw: bytes = resp.read() or b"{}"
        if not 200 <= resp.status < 300:
            try:
                message = str(json.loads(raw).get("message", raw.decode(errors="replace")))
            except ValueError:
                message = raw.decode(errors="replace")
            metrics.API_ERRORS.labels(verb=method, kind=kind, code=str(resp.status)).inc()
            raise ApiError(resp.status, message)
        result: dict[str, Any] = json.loads(raw)
        return result

    # ---------------------------------------------------------------- reads

    def list_labelled(self, kind: str, namespace: str, job_name: str) -> list[dict[str, Any]]:
        k = CHILD_KINDS.get(kind) or {"Pod": POD_KIND, "Lease": LEASE_KIND}[kind]
        out = self.request(
            "GET",
            k.collection(namespace),
            kind=kind,
            query={"labelSelector": f"{names.LABEL_JOB}={job_name}"},
        )
        items: list[dict[str, Any]] = out.get("items", [])
        return items

    def children(self, namespace: str, job_name: str) -> dict[tuple[str, str], dict[str, Any]]:
        """The job's existing children by (kind, name), selected by the `pipelinerl.io/job` label.
        The token Secret is read by its name instead: the operator may not list Secrets, whose
        contents every other workload in the namespace keeps there."""
        kinds = [k for k in CHILD_KINDS if k != "Secret"]
        lists = list(self.pool.map(lambda kind: (kind, self.list_labelled(kind, namespace, job_name)), kinds))
        child = names.Names(job_name)
        lists.append(("Secret", self.own_secret(namespace, child.token, names.LABEL_JOB, job_name)))
        key = self.own_secret(namespace, child.checkpoint_key, names.LABEL_CHECKPOINT_KEY_OF, job_name)
        lists.append(("Secret", key))
        return {(kind, obj["metadata"]["name"]): obj for kind, items in lists for obj in items}

    def own_secret(self, namespace: str, name: str, label: str, job_name: str) -> list[dict[str, Any]]:
        """The Secret `name` (GET by name), if it exists and carries `label`=`job_name`."""
        try:
            secret = self.request(
                "GET", f"{CHILD_KINDS['Secret'].collection(namespace)}/{name}", kind="Secret"
            )
        except ApiError as err:
            if err.status == 404:
                return []
            raise
        labels = secret.get("metadata", {}).get("labels") or {}
        return [secret] if labels.get(label) == job_name else []

    # ---------------------------------------------------------------- writes

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of one object, owning every field we set (force on conflicts)."""
        kind = obj["kind"]
        meta = obj["metadata"]
        path = f"{CHILD_KINDS[kind].collection(meta['namespace'])}/{meta['name']}"
        return self.request(
            "PATCH",
            path,
            kind=kind,
            query={"fieldManager": self.field_manager, "force": "true"},
            body=obj,
            content_type="application/apply-patch+yaml",
        )

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = obj["kind"]
        return self.request(
            "POST", CHILD_KINDS[kind].collection(obj["metadata"]["namespace"]), kind=kind, body=obj
        )

    def sync(self, desired: list[dict[str, Any]], live: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
        """Write what differs from `live`; returns `Kind/name` of each write, in `desired` order.

        Writes go out in parallel within a level and level by level (`WRITE_LEVEL`): StatefulSets
        last, so no pod starts before its ConfigMap, Secret, ServiceAccount and RoleBinding exist.
        """
        todo = [o for o in desired if needs_write(o, live.get((o["kind"], o["metadata"]["name"])))]
        for level in sorted({WRITE_LEVEL.get(o["kind"], 0) for o in todo}):
            batch = [o for o in todo if WRITE_LEVEL.get(o["kind"], 0) == level]
            list(self.pool.map(self._write, batch))  # list(): wait, and re-raise the first error
        return [f"{o['kind']}/{o['metadata']['name']}" for o in todo]

    def _write(self, obj: dict[str, Any]) -> None:
        if names.ANNOTATION_CREATE_ONLY not in obj["metadata"].get("annotations", {}):
            self.apply(obj)
            return
        try:
            self.create(obj)
        except ApiError as err:
            if err.status != 409:  # created meanwhile (another replica): keep theirs
                raise

    def delete_pod(self, namespace: str, name: str, grace_s: int | None, uid: str | None = None) -> None:
        """Delete a pod (already gone: nothing to do) with `grace_s` to stop (None: its own
        terminationGracePeriodSeconds). With `uid`, only that incarnation: a pod its StatefulSet
        already recreated under the same name is left alone."""
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_s is not None:
            options["gracePeriodSeconds"] = grace_s
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", f"{POD_KIND.collection(namespace)}/{name}", kind="Pod", body=options)
        except ApiError as err:
            if err.status not in (404, 409):  # 409: the uid precondition failed (a newer pod)
                raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Replace the job's status (merge patch on the status subresource; lists are replaced)."""
        self.request(
            "PATCH",
            f"{JOB_KIND.collection(namespace)}/{name}/status",
            kind=spec_mod.KIND,
            body={"status": status},
            content_type="application/merge-patch+json",
        )


def secret_token(live: dict[tuple[str, str], dict[str, Any]], job_name: str) -> str | None:
    """The job's RPC token from its live Secret, if that exists."""
    secret = live.get(("Secret", names.Names(job_name).token))
    if secret is None:
        return None
    data = secret.get("data", {}).get(names.TOKEN_KEY)
    return base64.b64decode(data).decode() if data else None
