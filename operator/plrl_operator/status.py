"""The job's status: its schema (`JobStatus`), and `compute_status`, a pure function of what was seen.

`compute_status(job, generators, children, previous, history, now)` turns the live children
(StatefulSets, pods, worker Leases) and the policy's history (restarts, outcome: see
`policy.decide`) into the status object; `handlers` writes it only when `changed()` says so, so an
unchanged job costs no write. Conditions keep their `lastTransitionTime` until their status flips.
Progress fields (step, lag, reward, throughput) come from trainer rank 0's Lease (a
`plrl_api.records.Progress` in its `pipelinerl.io/progress` annotation), rounded to what a table shows.
The `Ready` condition says why the first unready pod is not ready when its kubelet reports more than
a start-up (CrashLoopBackOff with the last exit code and message, CreateContainerConfigError ...).
The `WorkersHealthy` condition comes from every worker pod's Lease `renewTime` (`policy.health`).

`workers(job, children)` reduces the pods to what `policy.decide` needs, and `history(status)`
reads back what the last decisions left in status, so a restarted operator neither repeats nor
forgets one.

Neighbours: `plrl_operator.phases` (the phase decision), `plrl_operator.policy` (decisions),
`plrl_operator.crd` (generates the status schema from `JobStatus`), `plrl_operator.k8s`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from typing import Any, Literal

import pydantic
from pydantic import Field
from pydantic.alias_generators import to_camel

from plrl_api import names, plan, records
from plrl_api import spec as spec_mod
from plrl_operator import phases
from plrl_operator.policy import decide, health

# Condition types and reasons (the reasons double as Event reasons where an event is posted).
SCHEDULED = "PodsScheduled"
READY = "Ready"
SUSPENDED = "Suspended"
HEALTHY = "WorkersHealthy"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
_API_TIME_RESOLUTION = datetime.timedelta(seconds=1)  # metav1.Time (startedAt, creationTimestamp)
_STALE_LISTED = 5  # stale pods named in the condition's message; the rest are counted
_DETAIL_CHARS = 600  # of a container's termination message kept in a decision's reason


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Condition(_Model):
    """A standard Kubernetes condition (metav1.Condition shape)."""

    type: str = Field(
        description="Condition type: PodsScheduled, Ready, Suspended, WorkersHealthy, Succeeded or Failed."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="One-word CamelCase reason.")
    message: str = Field(default="", description="Human-readable detail, with a hint where one helps.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Job generation this was computed for.")


class AutoscalerStatus(_Model):
    """What the operator's autoscaler remembers across its looks and its own restarts."""

    state: dict[str, Any] = Field(
        default_factory=dict, description="The policy's state (last look, last change, pending reversal)."
    )
    changes: int = Field(default=0, ge=0, description="Changes of I made so far.")
    last_change: str | None = Field(default=None, description="The last change of I and why it was made.")
    last_change_cost_seconds: float | None = Field(
        default=None, description="What the last change cost: seconds until training passed its step."
    )
    timing_since: float | None = Field(
        default=None, description="Unix time of a change whose cost is still being timed."
    )
    timing_step: int | None = Field(default=None, description="The step training must pass to end it.")


class JobStatus(_Model):
    """`status` of a PipelineRLJob, written by the operator only."""

    phase: phases.Phase | None = Field(default=None, description="Lifecycle phase.")
    generators: int | None = Field(default=None, description="I: accelerators generating now.")
    trainers: int | None = Field(default=None, description="N - I: accelerators training now.")
    ready: str | None = Field(default=None, description="Worker pods ready / desired, e.g. 3/4.")
    step: int | None = Field(default=None, description="Optimizer steps done.")
    weight_version: int | None = Field(default=None, description="Weight version generators last received.")
    lag: records.Lag | None = Field(
        default=None, description="Policy lag of trained tokens, in optimizer steps."
    )
    reward: float | None = Field(default=None, description="Mean reward over the last optimizer step.")
    throughput: records.Throughput | None = Field(default=None, description="Generated and trained tokens/s.")
    restarts: int = Field(
        default=0, ge=0, description="Worker restarts so far (counted against failurePolicy.maxRestarts)."
    )
    counted_restarts: dict[str, int] = Field(
        default_factory=dict,
        description="Container restarts already counted, by pod uid (a restarted operator counts each once).",
    )
    replacing: list[str] = Field(
        default_factory=list,
        description="Uids of hung pods the operator is replacing (deleting); each counted once.",
    )
    autoscaler: AutoscalerStatus | None = Field(
        default=None, description="The autoscaler's memory (spec.pipeline.autoscale.enabled only)."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Current conditions.")
    observed_generation: int | None = Field(default=None, description="Job generation last reconciled.")
    start_time: str | None = Field(default=None, description="When the job first ran (RFC 3339).")
    completion_time: str | None = Field(default=None, description="When it succeeded or failed (RFC 3339).")


@dataclasses.dataclass(frozen=True)
class Children:
    """The live objects a status is computed from (raw API dicts, as listed)."""

    statefulsets: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # by role
    pods: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    leases: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    nodes: dict[str, health.NodeReadiness] = dataclasses.field(default_factory=dict)
    """Readiness of the nodes the pods are on, by node name (a node not listed is not judged)."""

    def own_leases(self) -> list[dict[str, Any]]:
        """The Leases not written by another incarnation of their pod. A pod force-deleted (to
        replace it, or to restart the trainers at a new world size) is recreated under its name at
        once, while its old process may still renew the Lease once as it exits: that renewal, later
        than the new pod's start, would be taken for the new pod's, and the new pod judged hung
        `timeoutSeconds` later (found in CI). Workers name their pod's uid on the Lease."""
        uids = {str(p["metadata"].get("name")): p["metadata"].get("uid") for p in self.pods}
        own = []
        for lease in self.leases:
            holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
            writer = (lease.get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_POD_UID)
            if writer and uids.get(holder) and writer != uids[holder]:
                continue
            own.append(lease)
        return own

    @functools.cached_property
    def reports(self) -> dict[str, Report]:
        """The heartbeat reports of current pods only (`_current_leases`), by pod name: parsed once
        per reconcile, however many decisions read them."""
        return _reports(_current_leases(self))


def parse(raw: dict[str, Any] | None) -> JobStatus:
    """The live status as our model; fields we do not own (e.g. kopf's) are ignored."""
    try:
        return JobStatus.model_validate(raw or {})
    except pydantic.ValidationError:
        return JobStatus()  # a hand-edited, broken status is recomputed from scratch


def _role(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("labels", {}).get(names.LABEL_ROLE, ""))


def _pod_condition(pod: dict[str, Any], ctype: str) -> dict[str, Any]:
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return {}


def _rolled_out(sts: dict[str, Any] | None, want: int) -> bool:
    if sts is None:
        return False
    st, spec = sts.get("status", {}), sts.get("spec", {})
    return bool(
        st.get("observedGeneration", 0) >= sts.get("metadata", {}).get("generation", 0)
        and spec.get("replicas") == want
        and st.get("replicas", 0) == want
        and st.get("updatedReplicas", 0) == want
        and (want == 0 or st.get("currentRevision") == st.get("updateRevision"))
    )


def observe(
    job: spec_mod.PipelineRLJob,
    pod_plan: plan.PodPlan,
    children: Children,
    outcome: decide.Outcome | None = None,
) -> tuple[phases.Observed, str]:
    """Reduce the children to the facts phases need, plus the scheduler's complaint (if any)."""
    suspended = job.spec.suspend
    stopped = suspended or outcome is not None
    want = {role: 0 if stopped else pod_plan.pods(role) for role in names.ROLES}
    revisions = {
        role: sts.get("status", {}).get("updateRevision") for role, sts in children.statefulsets.items()
    }
    scheduled = ready = 0
    complaint = ""
    for pod in sorted(children.pods, key=lambda p: str(p.get("metadata", {}).get("name"))):
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        role = _role(pod)
        sched = _pod_condition(pod, "PodScheduled")
        if pod.get("spec", {}).get("nodeName"):
            scheduled += 1
        elif sched.get("status") == "False" and sched.get("reason") == "Unschedulable" and not complaint:
            complaint = f"pod {pod['metadata']['name']}: {sched.get('message', 'unschedulable')}"
        current = pod.get("metadata", {}).get("labels", {}).get("controller-revision-hash") == revisions.get(
            role
        )
        if current and _pod_condition(pod, "Ready").get("status") == "True":
            ready += 1
    obs = phases.Observed(
        suspended=suspended,
        desired_pods=sum(want.values()),
        scheduled_pods=scheduled,
        ready_pods=ready,
        live_pods=len(children.pods),
        rolled_out=all(_rolled_out(children.statefulsets.get(r), want[r]) for r in names.ROLES),
        unschedulable=bool(complaint),
        succeeded=outcome is decide.Outcome.SUCCEEDED,
        failed=outcome is decide.Outcome.FAILED,
    )
    return obs, complaint


_STARTING = frozenset({"ContainerCreating", "PodInitializing"})


def not_ready_detail(children: Children) -> str:
    """Why the first worker pod that is not ready is not, when its kubelet says something a user can
    act on (a crash loop, a bad config reference, an image that cannot start); "" while pods merely
    start. E.g. `pod job-train-0: container trainer CrashLoopBackOff, last exit code 2: <message>`."""
    for pod in sorted(children.pods, key=lambda p: str(p.get("metadata", {}).get("name"))):
        meta = pod.get("metadata", {})
        if meta.get("deletionTimestamp") or _pod_condition(pod, "Ready").get("status") == "True":
            continue
        for c in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (c.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if not reason or reason in _STARTING:
                continue
            code, detail = _container_detail(c)
            text = f"pod {meta.get('name')}: container {c.get('name')} {reason}"
            if code is not None:
                text += f", last exit code {code}" + (f": {detail}" if detail else "")
            elif waiting.get("message"):
                text += f": {waiting['message']}"
            return text[:_DETAIL_CHARS]
    return ""


def _rounded(progress: records.Progress) -> records.Progress:
    """Progress as `kubectl get plrljobs` shows it: lag to 0.01 steps, reward to 0.001, rates to 1 tok/s."""
    lag = progress.lag.model_copy(update={"mean": round(progress.lag.mean, 2)})
    tp = progress.throughput
    throughput = tp.model_copy(
        update={
            "generated_tokens_per_second": round(tp.generated_tokens_per_second),
            "trained_tokens_per_second": round(tp.trained_tokens_per_second),
            "ratio": round(tp.ratio, 3),
        }
    )
    reward = None if progress.reward is None else round(progress.reward, 3)
    return progress.model_copy(update={"lag": lag, "throughput": throughput, "reward": reward})


def progress_from_leases(leases: list[dict[str, Any]]) -> records.Progress | None:
    """The coordinator's latest report, if any Lease carries one (the runtime's seam)."""
    return _progress(_reports(leases))


def _progress(reports: dict[str, Report]) -> records.Progress | None:
    return next((r.report.progress for r in reports.values() if r.report.progress is not None), None)


@dataclasses.dataclass(frozen=True)
class Report:
    """One worker's heartbeat report and when its Lease was renewed."""

    report: records.WorkerReport
    renewed: datetime.datetime | None


def _reports(leases: list[dict[str, Any]]) -> dict[str, Report]:
    """The reports the Leases carry, by holder (= pod name), in Lease order."""
    out: dict[str, Report] = {}
    for lease in leases:
        report = records.parse_annotations(lease.get("metadata", {}).get("annotations", {}))
        if report is not None:
            spec = lease.get("spec") or {}
            out[str(spec.get("holderIdentity") or "")] = Report(report, _time(spec.get("renewTime")))
    return out


def _container_detail(status: dict[str, Any]) -> tuple[int | None, str]:
    """(exit code, 'reason: message') of a container's last termination, as its kubelet reported it."""
    term = (status.get("lastState") or {}).get("terminated") or (status.get("state") or {}).get("terminated")
    if not term:
        return None, ""
    text = ": ".join(x for x in (term.get("reason"), (term.get("message") or "").strip()) if x)
    return term.get("exitCode"), text[-_DETAIL_CHARS:]


def workers(
    children: Children,
    heartbeat: spec_mod.HeartbeatSpec | None = None,
    now: datetime.datetime | None = None,
    failure_policy: spec_mod.FailurePolicySpec | None = None,
) -> tuple[decide.Worker, ...]:
    """The job's pods as `policy.decide` sees them: restarts the kubelet did, and why. With
    `heartbeat` and `now`, kinds the kubelet never acts on need replacing: a pod on a node that has
    not been Ready for `timeoutSeconds` was lost with it (its kubelet is gone: the pod stays
    "Running", or Terminating once evicted, until someone force-deletes it); a running pod whose
    Lease has not been renewed for `timeoutSeconds` is hung (the kubelet sees a live process); and,
    with `failure_policy`, a generator that trainer rank 0 reports slow for
    `slowGeneratorReplaceSeconds` stayed slow."""
    renewed = {
        str((lease.get("spec") or {}).get("holderIdentity") or ""): _time(
            (lease.get("spec") or {}).get("renewTime")
        )
        for lease in children.own_leases()
    }
    slow, reported_at = slow_generators(children)
    out = []
    for pod in children.pods:
        meta = pod.get("metadata", {})
        role = _role(pod)
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        lost = _lost_node(children.nodes.get(node), _time(meta.get("creationTimestamp")), heartbeat, now)
        if role not in names.ROLES or (meta.get("deletionTimestamp") and lost is None):
            continue  # a pod being deleted by its kubelet is not ours to judge
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
        code, detail = None, ""
        for c in statuses:
            c_code, c_detail = _container_detail(c)
            if c_code is not None:
                code, detail = c_code, f"container {c.get('name')}: {c_detail}" if c_detail else ""
        running = bool(statuses) and all("running" in (c.get("state") or {}) for c in statuses)
        name = str(meta.get("name"))
        # Since the container last started: a Lease renewed by its previous run says nothing. The
        # API's times have whole seconds, so a renewal in the second the container started may be
        # its predecessor's last one (a process killed and restarted at once): it is not counted.
        starts = [t for t in map(_started, statuses) if t is not None]
        start = max(starts) if starts else _time(meta.get("creationTimestamp"))
        started = None if start is None else start + _API_TIME_RESOLUTION
        how, replace = "", False
        if lost is not None:
            how, replace, detail = "was lost", True, f"its node {node} {lost}"
        elif running and heartbeat is not None and now is not None:
            beat = health.Beat(name, True, started, renewed.get(name))
            silent = health.verdict(beat, now, heartbeat)
            if silent is not None:
                replace = True
                detail = silent
            elif role == names.GENERATOR and name in slow and failure_policy is not None:
                assert reported_at is not None
                why = health.stays_slow(slow[name], reported_at, started, failure_policy)
                if why is not None:
                    how, replace, detail = "stayed slow", True, why
        out.append(
            decide.Worker(
                name=name,
                role=role,
                instance=str(meta.get("uid") or meta.get("name")),
                running=running,
                exit_code=code,
                platform_restarts=restarts,
                needs_restart=replace,
                detail=detail,
                lost_node=node if lost is not None else "",
                how=how,
            )
        )
    return tuple(out)


def slow_generators(children: Children) -> tuple[dict[str, records.SlowGenerator], datetime.datetime | None]:
    """The slow generators trainer rank 0 reports, by generator id (= pod name), and when it said so."""
    for r in children.reports.values():
        if r.report.progress is not None and r.renewed is not None:
            return {s.generator: s for s in r.report.progress.slow_generators}, r.renewed
    return {}, None


def _lost_node(
    node: health.NodeReadiness | None,
    created: datetime.datetime | None,
    heartbeat: spec_mod.HeartbeatSpec | None,
    now: datetime.datetime | None,
) -> str | None:
    """Why the pod's node is given up on ("has not been Ready for ..."), or None. Only a pod that
    was there before the node went down is lost with it: one bound to it later never started, and
    replacing it again and again would only spend the restart budget (the scheduler keeps new pods
    off a tainted NotReady node)."""
    if node is None or heartbeat is None or now is None:
        return None
    if created is not None and node.since is not None and created >= node.since:
        return None
    down = health.node_lost(node, now, heartbeat.timeout_seconds)
    if down is None:
        return None
    why = f" ({node.reason})" if node.reason else ""
    return (
        f"has not been Ready for {down:.0f} s{why} "
        f"(spec.heartbeat.timeoutSeconds={heartbeat.timeout_seconds:g}): lost with it"
    )


def _started(container_status: dict[str, Any]) -> datetime.datetime | None:
    return _time(((container_status.get("state") or {}).get("running") or {}).get("startedAt"))


def history(previous: JobStatus) -> decide.History:
    """What earlier decisions left in the status."""
    outcome = {phases.Phase.SUCCEEDED: decide.Outcome.SUCCEEDED, phases.Phase.FAILED: decide.Outcome.FAILED}
    out = outcome.get(previous.phase) if previous.phase is not None else None
    reason = next(
        (c.message for c in previous.conditions if c.type in (SUCCEEDED, FAILED) and c.status == "True"), ""
    )
    return decide.History(
        restarts=previous.restarts,
        counted=dict(previous.counted_restarts),
        outcome=out,
        reason=reason,
        replacing=frozenset(previous.replacing),
    )


def observation(
    children: Children,
    heartbeat: spec_mod.HeartbeatSpec | None = None,
    now: datetime.datetime | None = None,
    failure_policy: spec_mod.FailurePolicySpec | None = None,
) -> decide.Observation:
    """What `policy.decide` looks at."""
    progress = _progress(children.reports)
    return decide.Observation(
        workers=workers(children, heartbeat, now, failure_policy),
        finished=progress is not None and progress.finished,
    )


@dataclasses.dataclass(frozen=True)
class Capacities:
    """What the current pods report for the autoscaler (`records.WorkerReport.capacity_tokens_per_second`)."""

    step: int
    """Optimizer steps trainer rank 0 reports done."""
    trainers: float | None
    """The trainers' completion tokens per busy second in that step (None: not reported)."""
    generators: tuple[float | None, ...]
    """Each generator pod's tokens per decoding second, in pod order (None: not reported yet)."""


def capacities(children: Children, job_name: str, pod_plan: plan.PodPlan) -> Capacities | None:
    """The current pods' capacities, or None while trainer rank 0 reports no progress. Only current
    pods' reports count (`Children.reports`): a pod that left must not speak for the I in effect now."""
    reports = children.reports
    child = names.Names(job_name)
    rank0 = reports[child.pod(names.TRAINER, 0)].report if child.pod(names.TRAINER, 0) in reports else None
    if rank0 is None or rank0.progress is None:
        return None
    gens = [
        reports[pod].report if pod in reports else None
        for pod in (child.pod(names.GENERATOR, k) for k in range(pod_plan.generator_pods))
    ]
    return Capacities(
        step=rank0.progress.step,
        trainers=rank0.capacity_tokens_per_second,
        generators=tuple(None if g is None else g.capacity_tokens_per_second for g in gens),
    )


def _current_leases(children: Children) -> list[dict[str, Any]]:
    """The Leases renewed by a current pod (after it was created). Only these speak for the job (it
    finished, a generator is slow): a report left over from an earlier pod or job must not act on
    this one."""
    created = {
        str(p["metadata"].get("name")): _time(p["metadata"].get("creationTimestamp"))
        for p in children.pods
        if not p.get("metadata", {}).get("deletionTimestamp")
    }
    current = []
    for lease in children.own_leases():
        spec = lease.get("spec") or {}
        holder, renewed = str(spec.get("holderIdentity") or ""), _time(spec.get("renewTime"))
        born = created.get(holder)
        if holder in created and renewed is not None and (born is None or renewed >= born):
            current.append(lease)
    return current


def _time(raw: Any) -> datetime.datetime | None:
    """An RFC 3339 time (Time or MicroTime) from the API, or None if absent or unreadable."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        t = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=datetime.UTC)


def heartbeats(
    job: spec_mod.JobSpec, children: Children, now: datetime.datetime
) -> tuple[bool | None, str, str]:
    """(healthy, reason, message) of the WorkersHealthy condition, from the worker pods' Leases.

    Only Leases held by a live pod count (a scaled-away pod's Lease is history), and only if renewed
    since that pod was created (`health.Health.STARTING` otherwise: it may still be loading its
    model). None (Unknown) while no worker reports at all.
    """
    pods = {
        str(p["metadata"].get("name")): _time(p["metadata"].get("creationTimestamp"))
        for p in children.pods
        if not p.get("metadata", {}).get("deletionTimestamp")
    }
    timeout = job.heartbeat.timeout_seconds
    fresh: list[str] = []
    stale: list[tuple[str, datetime.datetime]] = []
    for lease in children.own_leases():
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        if holder not in pods:
            continue
        renewed = _time(spec.get("renewTime"))
        verdict = health.classify(health.Beat(holder, True, pods[holder], renewed), now, timeout)
        if verdict is health.Health.STALE and renewed is not None:
            stale.append((holder, renewed))
        elif verdict is health.Health.HEALTHY:
            fresh.append(holder)
    if stale:
        stale.sort()
        named = ", ".join(
            f"{pod} (last renewed {t.astimezone(datetime.UTC):%Y-%m-%dT%H:%M:%SZ})"
            for pod, t in stale[:_STALE_LISTED]
        )
        more = f" and {len(stale) - _STALE_LISTED} more" if len(stale) > _STALE_LISTED else ""
        return (
            False,
            "HeartbeatTimeout",
            f"{len(stale)}/{len(stale) + len(fresh)} workers silent for more than "
            f"spec.heartbeat.timeoutSeconds={timeout:g}: {named}{more}",
        )
    if not fresh:
        return None, "NoHeartbeats", "no worker has renewed its Lease yet"
    return True, "HeartbeatsCurrent", f"{len(fresh)} workers renewed their Lease within {timeout:g}s"


def _condition(
    previous: JobStatus,
    ctype: str,
    ok: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
) -> Condition:
    status: Literal["True", "False", "Unknown"] = "Unknown" if ok is None else "True" if ok else "False"
    old = next((c for c in previous.conditions if c.type == ctype), None)
    since = old.last_transition_time if old is not None and old.status == status else now
    return Condition(
        type=ctype,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def compute_status(
    job: spec_mod.PipelineRLJob,
    generators: int,
    children: Children,
    previous: JobStatus,
    now: datetime.datetime,
    decided: decide.History | None = None,
    autoscaler: AutoscalerStatus | None = None,
) -> JobStatus:
    """The status the job should have now; equal to `previous` when nothing changed.

    `decided` is the policy's history after this look (`policy.decide`); None keeps the previous.
    So does `autoscaler` None.
    """
    decided = history(previous) if decided is None else decided
    stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod_plan = plan.PodPlan.of(job.spec, generators)
    obs, complaint = observe(job, pod_plan, children, decided.outcome)
    phase = phases.next_phase(previous.phase, obs)
    gen = job.metadata.generation
    if obs.suspended:
        sched = (True, "Suspended", "spec.suspend is true: no pods are wanted")
    elif complaint:
        gpu = job.spec.resources.gpu_resource_name
        hint = (
            f"; the job needs {job.spec.resources.total_gpus} x {gpu} on nodes labelled "
            f"{gpu}.present=true that match its nodeSelector, affinity and tolerations"
        )
        sched = (False, "Unschedulable", complaint + hint)
    elif obs.scheduled_pods >= obs.desired_pods:
        sched = (True, "AllPodsScheduled", f"{obs.scheduled_pods}/{obs.desired_pods} pods scheduled")
    else:
        sched = (False, "WaitingForPods", f"{obs.scheduled_pods}/{obs.desired_pods} pods scheduled")
    all_ready = obs.ready_pods >= obs.desired_pods and obs.rolled_out and obs.desired_pods > 0
    ready_msg = f"{obs.ready_pods}/{obs.desired_pods} pods ready" + (
        "" if obs.rolled_out else "; a spec change is rolling out"
    )
    why_not = "" if all_ready or obs.suspended else not_ready_detail(children)
    if why_not:
        ready_msg += f"; {why_not}"
    conditions = [
        _condition(previous, SCHEDULED, sched[0], sched[1], sched[2], gen, stamp),
        _condition(
            previous, READY, all_ready, "AllPodsReady" if all_ready else "PodsNotReady", ready_msg, gen, stamp
        ),
        _condition(
            previous,
            SUSPENDED,
            obs.suspended,
            "Suspended" if obs.suspended else "Active",
            "spec.suspend is true" if obs.suspended else "spec.suspend is false",
            gen,
            stamp,
        ),
        _condition(previous, HEALTHY, *heartbeats(job.spec, children, now), gen, stamp),
    ]
    if phase is phases.Phase.SUCCEEDED:
        why = decided.reason or "trainer rank 0 reported the last step"
        conditions.append(_condition(previous, SUCCEEDED, True, "TrainingComplete", why, gen, stamp))
    elif phase is phases.Phase.FAILED:
        why = decided.reason or "the job failed"
        conditions.append(_condition(previous, FAILED, True, "RestartsExhausted", why, gen, stamp))
    progress = progress_from_leases(children.leases)
    progress = _rounded(progress) if progress is not None else None
    start = previous.start_time or (stamp if phase is phases.Phase.RUNNING else None)
    done = previous.completion_time or (stamp if phase in phases.TERMINAL else None)
    return JobStatus(
        phase=phase,
        generators=pod_plan.generator_gpus,
        trainers=pod_plan.trainer_gpus,
        ready=f"{obs.ready_pods}/{obs.desired_pods}",
        step=progress.step if progress else previous.step,
        weight_version=progress.weight_version if progress else previous.weight_version,
        lag=progress.lag if progress else previous.lag,
        reward=progress.reward if progress else previous.reward,
        throughput=progress.throughput if progress else previous.throughput,
        restarts=decided.restarts,
        counted_restarts=dict(decided.counted),
        replacing=sorted(decided.replacing),
        autoscaler=autoscaler if autoscaler is not None else previous.autoscaler,
        conditions=conditions,
        observed_generation=gen,
        start_time=start,
        completion_time=done,
    )


def dump(status: JobStatus) -> dict[str, Any]:
    """The status as written to the API (camelCase, no empty fields)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def patch(status: JobStatus) -> dict[str, Any]:
    """The status as a merge patch: fields that became empty are sent as null, so they are removed."""
    cleared: dict[str, Any] = {f.alias or name: None for name, f in JobStatus.model_fields.items()}
    return {**cleared, **dump(status)}


def changed(old: JobStatus, new: JobStatus) -> bool:
    """Whether writing `new` would change anything (transition times are kept by compute_status)."""
    return dump(old) != dump(new)
