"""Worker heartbeats: each worker pod renews the Lease `<job>-<pod>` with its numbers in annotations.

In a cluster (the pod's name and namespace in its `Identity`, from the downward API) a daemon
thread server-side-applies the coordination.k8s.io Lease `<job>-<pod>` every
`spec.heartbeat.intervalSeconds`: holderIdentity (the pod), renewTime, leaseDurationSeconds
(`spec.heartbeat.timeoutSeconds`), the labels `pipelinerl.io/job` and `pipelinerl.io/role` (the
operator watches Leases by the first), and annotations with the worker's role, weight version,
tokens/s, queue depth and utilisation, and the pod's uid (a pod recreated under the same name
while its old process still renews is told apart by it). Trainer rank 0 adds
`pipelinerl.io/progress`: the JSON of `plrl_api.records.Progress`, from which the operator fills
the job's STEP, LAG, REWARD and TOK/S and, once it says `finished`, marks the job Succeeded.

Under `plrl run` (no pod name, a run directory) every process writes the same Lease object, as
JSON, to `<run dir>/heartbeats/<process>.json` (e.g. `generator-1.json`), where the local runner
reads it the way the operator reads Leases: a process whose renewals stop (hung, SIGSTOPped) is
found stale after `timeoutSeconds` and replaced. Without either `start` returns None.

One Lease per pod: in a trainer pod with several ranks only local rank 0 renews it. The Lease is
owned by the job (as a plain owner: no `blockOwnerDeletion`, so the Lease verbs of the chart's
worker ClusterRole suffice), so deleting the job deletes it. A failed renewal is logged and
retried with backoff; it never reaches the worker's own loop.

Building a Lease is pure (`trainer_report`, `generator_report`, `lease`; the annotation encoding is
`plrl_api.records.lease_annotations`); `_Api` is the only I/O and this module the only one in the
workers that imports `kubernetes` (lazily: `plrl run` never pays for it).

Neighbours: `trainer.py` and `generator.py` (supply `records.WorkerReport`s), `plrl_api.records`
(the encoding the operator's status decodes), the operator's worker Role (what renewals run under).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import pathlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from plrl_api import identity, names, records, worker_config
from plrl_api import spec as spec_mod

if TYPE_CHECKING:
    from kubernetes import client as k8s_client

log = logging.getLogger("plrl.heartbeat")

FIELD_MANAGER = "plrl-worker"
SA_DIR = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
REQUEST_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class Target:
    """Which Lease this process renews, and how often."""

    namespace: str
    pod: str
    job: str
    job_uid: str | None
    role: str
    interval_s: float
    timeout_s: float
    local_dir: str | None = None
    """`plrl run`: write the Lease to `<local_dir>/<pod>.json` instead of the API server."""
    pod_uid: str | None = None
    """This incarnation of the pod (`names.ANNOTATION_POD_UID` on the Lease)."""

    @property
    def name(self) -> str:
        return names.Names(self.job).lease(self.pod)


def local_process_name(cfg: worker_config.WorkerConfig, ident: identity.Identity) -> str:
    """How `plrl run` names this process: `trainer-<rank>` or `generator-<index>`."""
    if cfg.role == names.TRAINER:
        return names.local_process(names.TRAINER, ident.rank(cfg.pods().gpus_per_trainer))
    return names.local_process(names.GENERATOR, ident.pod_index)


def target(cfg: worker_config.WorkerConfig, ident: identity.Identity) -> Target | None:
    """The Lease to renew: in a cluster this pod's; under `plrl run` (a run directory) this
    process's file; None otherwise."""
    hb = cfg.spec.heartbeat
    if not ident.namespace or not ident.pod_name:
        if not cfg.paths.run_dir:
            return None
        return Target(
            namespace="",
            pod=local_process_name(cfg, ident),
            job=cfg.job.name,
            job_uid=None,
            role=cfg.role,
            interval_s=hb.interval_seconds,
            timeout_s=hb.timeout_seconds,
            local_dir=str(pathlib.Path(cfg.paths.run_dir) / records.HEARTBEAT_DIR),
        )
    return Target(
        namespace=ident.namespace,
        pod=ident.pod_name,
        job=cfg.job.name,
        job_uid=cfg.job.uid,
        role=cfg.role,
        interval_s=hb.interval_seconds,
        timeout_s=hb.timeout_seconds,
        pod_uid=ident.pod_uid,
    )


# --------------------------------------------------------------------------- pure: reports -> Lease


def trainer_report(
    record: records.StepRecord | None,
    *,
    step: int,
    weight_version: int,
    finished: bool,
    tokens_per_second: float | None = None,
    queue_depth: int | None = None,
    slow_generators: Sequence[records.SlowGenerator] = (),
) -> records.WorkerReport:
    """Trainer rank 0's report: its progress (once there is something to say) and its rates."""
    return records.WorkerReport(
        role=names.TRAINER,
        weight_version=weight_version,
        tokens_per_second=tokens_per_second,
        queue_depth=queue_depth,
        utilisation=min(1.0, record.busy_s / record.step_s)
        if record is not None and record.step_s > 0
        else None,
        capacity_tokens_per_second=None if record is None else record.completion_tokens_per_busy_second,
        progress=records.progress(
            record,
            step=step,
            weight_version=weight_version,
            finished=finished,
            slow_generators=slow_generators,
        )
        if record is not None or finished
        else None,
    )


def generator_report(
    weight_version: int,
    tokens_per_second: float,
    in_flight: int,
    capacity: int,
    queue_depth: int,
    capacity_tokens_per_second: float | None = None,
) -> records.WorkerReport:
    return records.WorkerReport(
        role=names.GENERATOR,
        weight_version=weight_version,
        tokens_per_second=tokens_per_second,
        capacity_tokens_per_second=capacity_tokens_per_second,
        queue_depth=queue_depth,
        utilisation=min(1.0, in_flight / capacity) if capacity > 0 else None,
    )


def micro_time(t: datetime.datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease(
    tgt: Target, report: records.WorkerReport, *, now: datetime.datetime, acquired: datetime.datetime
) -> dict[str, Any]:
    """The whole Lease as this worker applies it (server-side apply: what is left out is removed)."""
    meta: dict[str, Any] = {
        "name": tgt.name,
        "namespace": tgt.namespace,
        "labels": {names.LABEL_JOB: tgt.job, names.LABEL_ROLE: tgt.role},
        "annotations": records.lease_annotations(report),
    }
    if tgt.pod_uid:
        meta["annotations"][names.ANNOTATION_POD_UID] = tgt.pod_uid
    if tgt.job_uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": f"{spec_mod.API_GROUP}/{spec_mod.API_VERSION}",
                "kind": spec_mod.KIND,
                "name": tgt.job,
                "uid": tgt.job_uid,
            }
        ]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": tgt.pod,
            "leaseDurationSeconds": max(1, math.ceil(tgt.timeout_s)),
            "acquireTime": micro_time(acquired),
            "renewTime": micro_time(now),
        },
    }


# --------------------------------------------------------------------------- I/O


class _Api:
    """Server-side apply of one Lease with the pod's ServiceAccount (or a kubeconfig's) credentials."""

    def __init__(self, api: k8s_client.ApiClient) -> None:
        from kubernetes import client

        self._api = api
        self._leases = client.CoordinationV1Api(api)

    @staticmethod
    def from_env(env: Mapping[str, str], sa_dir: pathlib.Path = SA_DIR) -> _Api:
        """In-cluster ServiceAccount credentials if mounted, else the kubeconfig `$KUBECONFIG` names."""
        from kubernetes import client, config

        if env.get("KUBERNETES_SERVICE_HOST") and (sa_dir / "token").exists():
            conf = client.Configuration()
            # Re-reads the token file when it expires: kubelet rotates projected tokens.
            loader = config.incluster_config.InClusterConfigLoader(
                token_filename=str(sa_dir / "token"), cert_filename=str(sa_dir / "ca.crt"), environ=env
            )
            loader.load_and_set(conf)
            return _Api(client.ApiClient(conf))
        if env.get("KUBECONFIG"):
            return _Api(config.new_client_from_config(config_file=env["KUBECONFIG"], persist_config=False))
        raise LookupError("no ServiceAccount token mounted and KUBECONFIG is unset")

    def apply(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        self._leases.patch_namespaced_lease(
            meta["name"],
            meta["namespace"],
            body,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
            _request_timeout=REQUEST_TIMEOUT_S,
        )

    def close(self) -> None:
        self._api.close()


class _LocalFile:
    """`plrl run`'s stand-in for the API server: the Lease as JSON in a file, replaced atomically.

    Closing marks the last renewal released (`names.ANNOTATION_RELEASED`): a worker that stopped
    renewing because it is exiting (releasing its engine, leaving process groups: seconds on a
    loaded machine) must read neither as hung nor, with no file at all, as still starting (which
    `heartbeat.startupTimeoutSeconds` would restart)."""

    def __init__(self, directory: pathlib.Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory
        self._last: dict[str, Any] | None = None

    def apply(self, body: dict[str, Any]) -> None:
        path = self._dir / f"{body['spec']['holderIdentity']}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        tmp.replace(path)
        self._last = body

    def close(self) -> None:
        if self._last is not None:
            metadata = self._last.setdefault("metadata", {})
            annotations = metadata.get("annotations") or {}
            metadata["annotations"] = {**annotations, names.ANNOTATION_RELEASED: "true"}
            self.apply(self._last)


def _describe(err: Exception) -> str:
    """An API error as `HTTP 403 Forbidden: <the API server's message>`, anything else by type."""
    code, reason = getattr(err, "status", None), getattr(err, "reason", None)
    if not code:
        return f"{type(err).__name__}: {err}"
    try:
        message = json.loads(getattr(err, "body", None) or "{}").get("message", "")
    except (ValueError, AttributeError):
        message = ""
    return f"HTTP {code} {reason}" + (f": {message}" if message else "")


class Heartbeat:
    """The renewal thread. `beat()` renews once; `stop()` ends the loop, then renews a
    last time so the final report (e.g. `finished`) reaches the operator."""

    def __init__(
        self,
        tgt: Target,
        report: Callable[[], records.WorkerReport],
        api: _Api | _LocalFile,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.target = tgt
        self._report = report
        self._api = api
        self._clock = clock
        self._acquired = clock()
        self._last = records.WorkerReport(role=tgt.role)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="heartbeat")
        self._failures = 0
        self.renewals = 0

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    @property
    def in_cluster(self) -> bool:
        """It renews a Lease on the API server (this process is a pod), not `plrl run`'s file."""
        return self.target.local_dir is None

    def beat(self) -> bool:
        """Renew the Lease once with a fresh report; False (logged) if that failed. Not reentrant."""
        try:
            self._last = self._report()
        except Exception:  # a broken report must not stop the worker proving it is alive
            log.exception("heartbeat report failed; renewing with the previous one")
        try:
            self._api.apply(lease(self.target, self._last, now=self._clock(), acquired=self._acquired))
        except Exception as err:  # the API server may be down, slow or refusing: retry, never crash
            self._failures += 1
            if self._failures == 1 or self._failures % 10 == 0:
                log.warning(
                    "renewing Lease %s/%s failed (%d in a row): %s",
                    self.target.namespace,
                    self.target.name,
                    self._failures,
                    _describe(err),
                )
            return False
        if self._failures:
            log.info("Lease %s renewed again after %d failures", self.target.name, self._failures)
        self._failures = 0
        self.renewals += 1
        return True

    def _run(self) -> None:
        interval = self.target.interval_s
        while not self._stop.is_set():
            ok = self.beat()
            # After a failure retry sooner (0.5 s, doubling) but never slower than the interval.
            self._stop.wait(interval if ok else min(interval, 0.5 * 2 ** min(self._failures - 1, 10)))

    def stop(self, *, final: bool = True) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=REQUEST_TIMEOUT_S + 5)
        if final and not self._thread.is_alive():  # never two renewals at once
            self.beat()
        self._api.close()


def start(
    cfg: worker_config.WorkerConfig,
    ident: identity.Identity,
    report: Callable[[], records.WorkerReport],
    env: Mapping[str, str] | None = None,
    sa_dir: pathlib.Path = SA_DIR,
) -> Heartbeat | None:
    """Start renewing this pod's Lease; None outside a cluster or without credentials (logged).

    `env` (default: the process's; where the API server's address and a kubeconfig are found) and
    `sa_dir` (where a pod's ServiceAccount token is mounted) are for tests.
    """
    env = os.environ if env is None else env
    tgt = target(cfg, ident)
    if tgt is None:
        return None
    if tgt.local_dir is not None:
        return Heartbeat(tgt, report, _LocalFile(pathlib.Path(tgt.local_dir))).start()
    try:
        api = _Api.from_env(env, sa_dir)
    except Exception as err:  # e.g. automountServiceAccountToken: false
        # Training goes on, but the operator sees a worker that never heartbeats: it restarts it
        # after the start-up deadline, and cannot tell when a job it cannot see has finished.
        log.warning(
            "no heartbeat for %s: cannot reach the API server (%s); the operator will take this "
            "worker for hung after heartbeat.startupTimeoutSeconds=%g",
            tgt.name,
            _describe(err),
            cfg.spec.heartbeat.startup_deadline_seconds,
        )
        return None
    log.info("renewing Lease %s/%s every %.1f s", tgt.namespace, tgt.name, tgt.interval_s)
    return Heartbeat(tgt, report, api).start()
