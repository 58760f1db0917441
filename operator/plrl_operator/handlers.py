# mypy: disallow-untyped-decorators=False
# (pyproject skips following kopf, so its decorators are Any to mypy; the handlers stay typed.)
"""kopf wiring: the only module that imports kopf. Every handler is parse -> pure functions -> apply.

- create / update (spec) / resume: `_reconcile` renders the desired children, lists the live ones
  (`k8s.Client.children`) and writes only those whose content hash differs, then refreshes status.
- a timer per job: observe -> decide -> act. It reads the job's StatefulSets, pods and worker
  Leases from in-memory indexes (fed by watches, so a quiet job costs no API request), asks
  `policy.decide` what to do about them (count a restart, fail or finish the job), writes status
  (which records the decisions) only on change, posts an Event per decision, force-deletes the pods
  it decided to replace (hung, or lost with a NotReady node: `node_readiness` indexes nodes), and re-runs the
  reconcile if a child went missing, drifted from the desired hash, or the job just ended (its
  StatefulSets scale to zero).
- deletion: nothing to do; every child has the job as controller owner, so the garbage collector
  removes them (the timer's finalizer is kopf's own, removed by kopf on delete).
- admission (when `webhook_port` is set): `validate_job` refuses a create or update that
  `plrl run` would refuse (`admission.review`), with the same lines; the webhook server's
  certificate comes from the chart's Secret or, outside the cluster, from `certs.write`, and then
  kopf also keeps the ValidatingWebhookConfiguration pointing at this process.

kopf's own bookkeeping goes into `pipelinerl.io/*` annotations (not status), so the status
schema stays strict. Handlers are bound to a registry by `register(registry, config)` (called by
`run`), so nothing is read from the environment at import time.
Neighbours: `render`, `status`, `policy.decide`, `k8s`, `events`, `metrics`, `settings`,
`admission`, `certs`.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import logging
import pathlib
import secrets
import tempfile
import time
from collections.abc import Callable
from typing import Any

import kopf

from plrl_api import names, plan
from plrl_api import spec as spec_mod
from plrl_operator import admission, autoscaling, certs, events, k8s, metrics, phases, render, status
from plrl_operator import settings as settings_mod
from plrl_operator.policy import decide, health, types

LOG = logging.getLogger("plrl_operator")
GROUP, VERSION, PLURAL = spec_mod.API_GROUP, spec_mod.API_VERSION, spec_mod.PLURAL
_CONFIG = settings_mod.OperatorConfig()  # replaced by `register`
_CLIENT: k8s.Client | None = None
_PHASES: dict[tuple[str, str], str] = {}  # (namespace, name) -> phase, for the jobs-by-phase gauge


def client() -> k8s.Client:
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = k8s.Client.from_environment(_CONFIG.field_manager)
    return _CLIENT


# --------------------------------------------------------------------------- startup


def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.INFO  # our explicit events only (posting.loggers stays off)
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    if _CONFIG.peering is not None:
        settings.peering.name = _CONFIG.peering
        settings.peering.mandatory = True
        settings.peering.clusterwide = _CONFIG.clusterwide
    if _CONFIG.metrics_port:
        metrics.serve(_CONFIG.metrics_port)
    if _CONFIG.webhook_port:
        settings.admission.server = _webhook_server(_CONFIG)
        if _CONFIG.webhook_host:  # outside the cluster: kopf keeps our webhook configuration current
            settings.admission.managed = _CONFIG.webhook_configuration
    client()  # fail at startup, not in the first handler, if there are no credentials


def _webhook_server(config: settings_mod.OperatorConfig) -> kopf.WebhookServer:
    """HTTPS for the admission webhook: the chart's certificate files, or a fresh CA and
    certificate for `webhook_host` (an operator outside the cluster)."""
    if config.webhook_cert_dir:
        cert_dir = pathlib.Path(config.webhook_cert_dir)
    else:
        assert config.webhook_host is not None  # settings.check
        cert_dir = certs.write(pathlib.Path(tempfile.mkdtemp(prefix="plrl-webhook-")), [config.webhook_host])
        LOG.info("admission webhook: generated a certificate for %s in %s", config.webhook_host, cert_dir)
    ca = cert_dir / certs.CA_FILE
    return kopf.WebhookServer(
        addr=config.webhook_addr,
        port=config.webhook_port,
        host=config.webhook_host,
        certfile=cert_dir / certs.CERT_FILE,
        pkeyfile=cert_dir / certs.KEY_FILE,
        cafile=ca if ca.exists() else None,
    )


# --------------------------------------------------------------------------- indexes


def _key(namespace: str | None, labels: kopf.Labels) -> tuple[str, str]:
    return (namespace or "", labels[names.LABEL_JOB])


def job_statefulsets(
    namespace: str | None,
    labels: kopf.Labels,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    **_: Any,
) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        _key(namespace, labels): {
            "metadata": {
                "name": meta.get("name"),
                "generation": meta.get("generation"),
                "labels": dict(labels),
                "annotations": dict(meta.annotations),
            },
            "spec": {"replicas": spec.get("replicas")},
            "status": copy.deepcopy(dict(status)),
        }
    }


def job_pods(
    namespace: str | None,
    labels: kopf.Labels,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    **_: Any,
) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        _key(namespace, labels): {
            "metadata": {
                "name": meta.get("name"),
                "uid": meta.get("uid"),
                "labels": dict(labels),
                "creationTimestamp": meta.get("creationTimestamp"),
                "deletionTimestamp": meta.get("deletionTimestamp"),
            },
            "spec": {"nodeName": spec.get("nodeName")},
            "status": {
                "phase": status.get("phase"),
                "conditions": copy.deepcopy(status.get("conditions")),
                "containerStatuses": copy.deepcopy(status.get("containerStatuses")),
            },
        }
    }


def job_leases(
    namespace: str | None, labels: kopf.Labels, meta: kopf.Meta, spec: kopf.Spec, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        _key(namespace, labels): {
            "metadata": {"name": meta.get("name"), "annotations": dict(meta.annotations)},
            "spec": {"holderIdentity": spec.get("holderIdentity"), "renewTime": spec.get("renewTime")},
        }
    }


def node_readiness(name: str, status: kopf.Status, **_: Any) -> dict[str, health.NodeReadiness]:
    """Every node's Ready condition, by name (nodes are cluster-scoped: watched cluster-wide even by
    a namespaced operator; only the condition is kept)."""
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    since = ready.get("lastTransitionTime")
    return {
        name: health.NodeReadiness(
            status=ready.get("status"),
            since=datetime.datetime.fromisoformat(since) if isinstance(since, str) and since else None,
            reason=str(ready.get("reason") or ""),
        )
    }


def _children(body: kopf.Body, indexes: dict[str, Any]) -> status.Children:
    """The job's children as the indexes (kwargs `job_statefulsets`, ...) currently see them."""
    key = (body.metadata.namespace or "", body.metadata.name or "")

    def values(index: str) -> list[dict[str, Any]]:
        store = indexes[index]
        return list(store[key]) if key in store else []

    sts = {str(s["metadata"]["labels"].get(names.LABEL_ROLE)): s for s in values("job_statefulsets")}
    pods = values("job_pods")
    readiness = indexes["node_readiness"]
    on = {str(p["spec"].get("nodeName") or "") for p in pods} & set(readiness.keys())
    nodes = {n: next(iter(readiness[n])) for n in on}
    return status.Children(statefulsets=sts, pods=pods, leases=values("job_leases"), nodes=nodes)


# --------------------------------------------------------------------------- reconcile


def _parse(body: kopf.Body) -> spec_mod.PipelineRLJob:
    meta = body["metadata"]
    doc = {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "metadata": {
            k: meta.get(k) for k in ("name", "namespace", "uid", "generation") if meta.get(k) is not None
        },
        "spec": copy.deepcopy(dict(body.get("spec", {}))),
    }
    try:
        return spec_mod.parse_job(doc)
    except spec_mod.JobFileError as err:
        kopf.warn(body, reason=events.INVALID_SPEC, message=str(err))
        raise kopf.PermanentError(f"invalid spec: {err}") from None


def _sync(job: spec_mod.PipelineRLJob, generators: int, stopped: bool) -> tuple[list[str], dict[str, str]]:
    """Blocking: list children, write what differs. Returns the writes and the applied hashes."""
    api = client()
    ns, name = job.metadata.namespace or "default", job.metadata.name
    live = api.children(ns, name)
    token = k8s.secret_token(live, name)
    # The Secret is written only when missing (create-only): only then are a token and TLS files made.
    tls = None if token is not None else certs.job_tls()
    token = token or secrets.token_urlsafe(32)
    # Made only if missing: a job applied again after a delete finds its predecessor's key.
    key = secrets.token_urlsafe(32)
    desired = render.render(
        job,
        generators,
        token=token,
        tls=tls,
        checkpoint_key=key,
        stopped=stopped,
        worker_role=_CONFIG.worker_cluster_role,
    )
    written = api.sync(desired, live)
    for w in written:
        metrics.OBJECT_WRITES.labels(kind=w.split("/")[0]).inc()
    return written, _hashes(desired)


def _hashes(desired: list[dict[str, Any]]) -> dict[str, str]:
    return {
        f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["annotations"][names.ANNOTATION_DESIRED_HASH]
        for o in desired
        if names.ANNOTATION_DESIRED_HASH in o["metadata"].get("annotations", {})
    }


async def _reconcile(
    trigger: str,
    body: kopf.Body,
    memo: kopf.Memo,
    children: status.Children,
    force_sync: bool = True,
) -> None:
    # One reconcile per job at a time: the timer must not re-apply what a create/update handler is
    # still applying (it would see the children missing from the indexes and write them again).
    lock: asyncio.Lock = memo.setdefault("lock", asyncio.Lock())
    async with lock:
        await _reconcile_locked(trigger, body, memo, children, force_sync)


async def _reconcile_locked(
    trigger: str, body: kopf.Body, memo: kopf.Memo, children: status.Children, force_sync: bool
) -> None:
    metrics.RECONCILES.labels(trigger=trigger).inc()
    started = time.perf_counter()
    try:
        job = _parse(body)
        previous = status.parse(body.get("status"))
        generators = decide.current_generators(job.spec, previous.generators)
        now = datetime.datetime.now(datetime.UTC)
        observed = status.observation(children, job.spec.heartbeat, now, job.spec.failure_policy)
        verdict = decide.decide(job.spec, observed, status.history(previous))
        # A job that ended keeps its objects (ConfigMap, checkpoints' PVCs) but no running pods.
        stopped = verdict.history.outcome is not None
        pod_plan = plan.PodPlan.of(job.spec, generators)
        caps = status.capacities(children, job.metadata.name, pod_plan)
        scaler = _autoscaler(memo, job, caps, previous) if not stopped else None
        change = None
        if scaler is not None and caps is not None and trigger == "timer":
            looked_at = time.time()
            change = scaler.look(pod_plan, caps, looked_at)
            if change is not None:
                scaler.applied(looked_at, caps.step)
                generators = change.generators
                # Recorded before it is carried out: a restarted operator renders the new I from status.
                previous = await _write_status(
                    body, job, generators, children, previous, verdict.history, scaler.to_status()
                )
                force_sync = True
        if force_sync or _drifted(job, generators, stopped, children, memo):
            written, applied = await asyncio.to_thread(_sync, job, generators, stopped)
            memo["applied"] = applied
            if written:
                LOG.info("%s %s/%s: wrote %s", trigger, job.metadata.namespace, job.metadata.name, written)
                if trigger in ("create", "update"):
                    reason = events.CREATED if trigger == "create" else events.UPDATED
                    kopf.info(
                        body, reason=reason, message=f"applied {len(written)} objects: {', '.join(written)}"
                    )
        # The decision is recorded (status) before it is carried out, so a restarted operator
        # finds it and neither forgets nor counts it again (`decide.Restart.repeat`).
        await _write_status(
            body, job, generators, children, previous, verdict.history, scaler.to_status() if scaler else None
        )
        if change is not None:
            await _rescale_trainers(body, job, change, children)
        _post_decisions(body, verdict.decisions)
        _post_migrations(body, memo, children)
        await _replace(body, job, verdict.decisions, observed.workers)
    except k8s.ApiError as err:
        metrics.RECONCILE_ERRORS.labels(trigger=trigger, error=f"http{err.status}").inc()
        kopf.warn(body, reason=events.RECONCILE_FAILED, message=str(err))
        if err.status in (400, 403, 422):
            raise kopf.PermanentError(str(err)) from None
        raise kopf.TemporaryError(str(err), delay=5) from None
    except kopf.PermanentError:
        metrics.RECONCILE_ERRORS.labels(trigger=trigger, error="invalid").inc()
        raise
    finally:
        metrics.RECONCILE_SECONDS.labels(trigger=trigger).observe(time.perf_counter() - started)


def _drifted(
    job: spec_mod.PipelineRLJob, generators: int, stopped: bool, children: status.Children, memo: kopf.Memo
) -> bool:
    """A StatefulSet is missing or its hash differs from both the desired and the last applied."""
    role = _CONFIG.worker_cluster_role
    desired = _hashes(render.render(job, generators, stopped=stopped, worker_role=role))
    applied: dict[str, str] = memo.get("applied", {})
    child = names.Names(job.metadata.name)
    for role in names.ROLES:
        sts = children.statefulsets.get(role)
        want = desired[f"StatefulSet/{child.role(role)}"]
        live = None if sts is None else sts["metadata"]["annotations"].get(names.ANNOTATION_DESIRED_HASH)
        if live != want and applied.get(f"StatefulSet/{child.role(role)}") != want:
            return True
    return False


async def _write_status(
    body: kopf.Body,
    job: spec_mod.PipelineRLJob,
    generators: int,
    children: status.Children,
    previous: status.JobStatus,
    decided: decide.History,
    autoscaler: status.AutoscalerStatus | None = None,
) -> status.JobStatus:
    """Write the status the job should have now (if it differs); returns it."""
    now = datetime.datetime.now(datetime.UTC)
    new = status.compute_status(job, generators, children, previous, now, decided, autoscaler)
    ns, name = job.metadata.namespace or "default", job.metadata.name
    _PHASES[(ns, name)] = str(new.phase)
    _update_phase_gauge()
    if not status.changed(previous, new):
        return new
    await asyncio.to_thread(client().patch_status, ns, name, status.patch(new))
    metrics.STATUS_WRITES.inc()
    _post_transitions(body, previous, new)
    return new


def _post_transitions(body: kopf.Body, old: status.JobStatus, new: status.JobStatus) -> None:
    if old.phase != new.phase and new.phase is not None:
        if new.phase is phases.Phase.SUSPENDED:
            kopf.info(body, reason=events.SUSPENDED, message="spec.suspend is true: workers scaled to zero")
        elif old.phase is phases.Phase.SUSPENDED:
            kopf.info(body, reason=events.RESUMED, message="spec.suspend is false: workers scaled back")
        kopf.info(body, reason=events.PHASE_CHANGED, message=f"{old.phase or 'New'} -> {new.phase}")
    unschedulable = _entered(old, new, status.SCHEDULED, lambda c: c.reason == "Unschedulable")
    if unschedulable is not None:
        kopf.warn(body, reason=events.UNSCHEDULABLE, message=unschedulable.message)
    unhealthy = _entered(old, new, status.HEALTHY, lambda c: c.status == "False")
    if unhealthy is not None:
        kopf.warn(body, reason=events.HEARTBEAT_TIMEOUT, message=unhealthy.message)


def _post_decisions(body: kopf.Body, decisions: tuple[decide.Decision, ...]) -> None:
    """One Event per decision, after the status that records it was written (so a restarted
    operator may miss an Event, but never repeats the decision)."""
    for d in decisions:
        if isinstance(d, decide.Restart) and not d.repeat:
            if d.lost_node:
                kopf.warn(
                    body,
                    reason=events.NODE_NOT_READY,
                    message=f"force-deleting pod {d.worker} on node {d.lost_node} so that it is rescheduled",
                )
            kopf.warn(body, reason=events.WORKER_RESTARTED, message=d.reason)
        elif isinstance(d, decide.Fail):
            kopf.warn(body, reason=events.JOB_FAILED, message=d.reason)
        elif isinstance(d, decide.Finish):
            kopf.info(body, reason=events.JOB_SUCCEEDED, message=d.reason)


def _post_migrations(body: kopf.Body, memo: kopf.Memo, children: status.Children) -> None:
    """A Warning each time trainer rank 0 has moved more of a slow generator's work to its peers
    (remembered in the job's memo: a restarted operator may say the latest one again)."""
    said: dict[str, int] = memo.setdefault("migrated", {})
    slow, _ = status.slow_generators(children)
    for gen in slow.values():
        if gen.migrated > said.get(gen.generator, 0):
            kopf.warn(
                body,
                reason=events.SLOW_GENERATOR,
                message=f"generator {gen.generator} is slow: {gen.rate:.2f} rollout groups/s against its "
                f"peers' median {gen.peers_median:.2f} for {gen.slow_for_seconds:.0f} s; "
                f"{gen.migrated} of its leases migrated to its peers so far",
            )
            said[gen.generator] = gen.migrated


async def _replace(
    body: kopf.Body,
    job: spec_mod.PipelineRLJob,
    decisions: tuple[decide.Decision, ...],
    workers: tuple[decide.Worker, ...],
) -> None:
    """Delete each pod `decide` wants replaced, at once (grace 0, a force delete): a hung process
    would not act on SIGTERM, a lost node's kubelet would never confirm a graceful delete, and the
    StatefulSet creates the replacement only once the old pod is gone. Its leases come back to the
    coordinator when its streams break; anything it sends later is fenced. A trainer's restart
    takes every trainer pod along (`decide.trainer_group`), the one the kubelet already restarted
    included: the new group meets at a fresh rendezvous and resumes from the latest checkpoint."""
    ns = job.metadata.namespace or "default"
    doomed = [d.worker for d in decisions if isinstance(d, decide.Restart) and not d.by_platform]
    trainer_group = decide.trainer_group(decisions, workers)
    if len(trainer_group) < 2:
        trainer_group = ()  # a lone trainer the kubelet restarted has its fresh group already
    doomed += [t for t in trainer_group if t not in doomed]
    if trainer_group:
        kopf.info(
            body,
            reason=events.TRAINER_GROUP_RESTARTED,
            message=f"replacing trainer pods {', '.join(trainer_group)}: the group resumes from its "
            "latest checkpoint (one restart counted)",
        )
    uids = {w.name: w.instance for w in workers}
    await _delete_pods(ns, {pod: uids.get(pod) for pod in doomed}, grace_s=0)


async def _delete_pods(namespace: str, pods: dict[str, str | None], grace_s: int | None) -> None:
    """Delete each pod (`grace_s` 0: force-delete; None: the pod's own grace period),
    preconditioned on its uid where known: a replacement the StatefulSet already made under the
    same name is never taken along."""
    for pod, uid in pods.items():
        await asyncio.to_thread(client().delete_pod, namespace, pod, grace_s, uid)


def _autoscaler(
    memo: kopf.Memo, job: spec_mod.PipelineRLJob, caps: status.Capacities | None, previous: status.JobStatus
) -> autoscaling.JobAutoscaler | None:
    """The job's autoscaler (kept in its memo), or None when the job does not autoscale."""
    pipeline = job.spec.pipeline
    if not pipeline.autoscale.enabled or pipeline.mode is not spec_mod.PipelineMode.PIPELINE:
        memo.pop("autoscaler", None)
        return None
    scaler: autoscaling.JobAutoscaler | None = memo.get("autoscaler")
    if scaler is None:
        scaler = autoscaling.JobAutoscaler.restore(job.spec, previous.autoscaler, caps.step if caps else 0)
        memo["autoscaler"] = scaler
    return scaler


async def _rescale_trainers(
    body: kopf.Body, job: spec_mod.PipelineRLJob, change: types.Decision, children: status.Children
) -> None:
    """Carry out a change of I: the StatefulSets already have their new replicas (generators join or
    leave on their own: a leaving one finishes what it decodes, within a bound, and its unfinished
    leases go back to the queue); the trainers' world size changed, so every trainer pod of the old
    size is deleted at once, gracefully: on SIGTERM the group ends its current step and checkpoints
    it, and the new group resumes from that checkpoint (one of any world size loads). Deleting them
    one by one, as a rolling update would, leaves a group that can never meet."""
    kopf.info(
        body,
        reason=events.RESCALED,
        message=f"{autoscaling.describe(change)}; trainer pods checkpoint the step they are on and restart "
        "from it with the new world size",
    )
    trainers = {
        str(p["metadata"]["name"]): p["metadata"].get("uid")
        for p in children.pods
        if p["metadata"].get("labels", {}).get(names.LABEL_ROLE) == names.TRAINER
        and not p["metadata"].get("deletionTimestamp")
    }
    await _delete_pods(job.metadata.namespace or "default", trainers, grace_s=None)


def _entered(
    old: status.JobStatus, new: status.JobStatus, kind: str, state: Callable[[status.Condition], bool]
) -> status.Condition | None:
    """`new`'s `kind` condition if it entered `state` since `old` (warn once, not every reconcile)."""
    before = next((c for c in old.conditions if c.type == kind), None)
    now = next((c for c in new.conditions if c.type == kind), None)
    if now is not None and state(now) and (before is None or not state(before)):
        return now
    return None


def _update_phase_gauge() -> None:
    counts: dict[str, int] = {p.value: 0 for p in phases.Phase}
    for phase in _PHASES.values():
        counts[phase] = counts.get(phase, 0) + 1
    for phase, n in counts.items():
        metrics.JOBS_BY_PHASE.labels(phase=phase).set(n)


async def on_create(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    await _reconcile("create", body, memo, _children(body, kwargs))


async def on_update(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    await _reconcile("update", body, memo, _children(body, kwargs))


async def on_resume(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    await _reconcile("resume", body, memo, _children(body, kwargs))


async def refresh(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    await _reconcile("timer", body, memo, _children(body, kwargs), force_sync=False)


def validate_job(
    body: kopf.Body, operation: str | None, old: kopf.Body | None, new: kopf.Body | None, **_: Any
) -> None:
    """Admission: refuse a create or update that `plrl run` would refuse, with the same lines."""

    def raw(b: kopf.Body | None) -> dict[str, Any] | None:
        return None if b is None else copy.deepcopy(dict(b))

    problems = admission.review(operation, raw(new) or raw(body), raw(old))
    metrics.ADMISSION_REVIEWS.labels(operation=operation or "", allowed=str(not problems).lower()).inc()
    if problems:
        raise kopf.AdmissionError("\n".join(problems), code=422)


def _forget(type: str, body: kopf.Body, **_: Any) -> None:
    if type == "DELETED":
        _PHASES.pop((body.metadata.namespace or "", body.metadata.name or ""), None)
        _update_phase_gauge()


def register(registry: kopf.OperatorRegistry, config: settings_mod.OperatorConfig) -> None:
    """Bind every handler to `registry`; `config` sets the timer interval and kopf's settings."""
    global _CONFIG
    _CONFIG = config
    children = {names.LABEL_JOB: kopf.PRESENT}
    # A fresh registry has none of kopf's default login handlers: credentials through `kubernetes`
    # (in-cluster ServiceAccount, else $KUBECONFIG), as the default registry would find them.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(_configure)
    kopf.index("apps", "v1", "statefulsets", labels=children, registry=registry)(job_statefulsets)
    kopf.index("", "v1", "pods", labels=children, registry=registry)(job_pods)
    kopf.index("coordination.k8s.io", "v1", "leases", labels=children, registry=registry)(job_leases)
    kopf.index("", "v1", "nodes", registry=registry)(node_readiness)
    kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)(on_create)
    kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile", field="spec", registry=registry)(on_update)
    kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)(on_resume)
    kopf.timer(
        GROUP,
        VERSION,
        PLURAL,
        id="refresh",
        interval=config.status_interval,
        initial_delay=1.0,
        registry=registry,
    )(refresh)
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)(_forget)
    if config.webhook_port:
        kopf.on.validate(
            GROUP,
            VERSION,
            PLURAL,
            id=admission.HANDLER_ID,
            operations=list(admission.OPERATIONS),
            registry=registry,
        )(validate_job)


# --------------------------------------------------------------------------- entry point


def _drop_routine(record: logging.LogRecord) -> bool:
    """Keep kopf's object log for what matters (errors, peering pauses), not per-tick successes."""
    if record.levelno > logging.INFO:
        return True
    message = record.getMessage()
    return not (message.endswith(" succeeded.") or " is processed: " in message)


def run(config: settings_mod.OperatorConfig) -> None:
    """Run the operator until SIGINT/SIGTERM (blocking)."""
    registry = kopf.OperatorRegistry()
    register(registry, config)
    kopf.configure(verbose=False)
    # kopf logs every handler and timer success at INFO (a line per job per tick); ours says what changed.
    logging.getLogger("kopf.objects").addFilter(_drop_routine)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("plrl_operator").setLevel(logging.INFO)
    kopf.run(
        registry=registry,
        clusterwide=config.clusterwide,
        namespaces=config.namespaces,
        standalone=config.peering is None,
        peering_name=config.peering,
        priority=config.priority,
        liveness_endpoint=f"http://0.0.0.0:{config.liveness_port}/healthz" if config.liveness_port else None,
    )
