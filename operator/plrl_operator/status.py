"""The job's status: its schema (`JobStatus`), and `compute_status`, a pure function of what was seen.

`compute_status(job, generators, children, previous, now)` turns the live children (StatefulSets,
pods, worker Leases) into the status object; `handlers` writes it only when `changed()` says so,
so an unchanged job costs no write. Conditions keep their `lastTransitionTime` until their status
flips. Progress fields (step, lag, reward, throughput) come from the coordinator's Lease: the
runtime (`plrl_workers.heartbeat`) writes a `Progress` JSON into its `pipelinerl.io/progress`
annotation. The `WorkersHealthy` condition comes from every worker pod's Lease `renewTime`: a pod
whose worker has not renewed within `spec.heartbeat.timeoutSeconds` is stale.

Neighbours: `plrl_operator.phases` (the phase decision), `plrl_operator.crd` (generates the
status schema from `JobStatus`), `plrl_operator.k8s` (reads children, writes status).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any, Literal

import pydantic
from pydantic import Field
from pydantic.alias_generators import to_camel

from plrl_operator import phases
from plrl_operator import spec as spec_mod
from plrl_operator.policy import planner
from plrl_operator.render import common

PROGRESS_ANNOTATION = "pipelinerl.io/progress"

# Condition types and reasons (the reasons double as Event reasons where an event is posted).
SCHEDULED = "PodsScheduled"
READY = "Ready"
SUSPENDED = "Suspended"
HEALTHY = "WorkersHealthy"
_STALE_LISTED = 5  # stale pods named in the condition's message; the rest are counted


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Condition(_Model):
    """A standard Kubernetes condition (metav1.Condition shape)."""

    type: str = Field(description="Condition type: PodsScheduled, Ready, Suspended or WorkersHealthy.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="One-word CamelCase reason.")
    message: str = Field(default="", description="Human-readable detail, with a hint where one helps.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Job generation this was computed for.")


class Lag(_Model):
    """Policy lag of trained tokens, in optimizer steps."""

    mean: float = Field(default=0.0, ge=0, description="Mean lag over the last optimizer step.")
    max: int = Field(default=0, ge=0, description="Largest lag over the last optimizer step.")


class Throughput(_Model):
    """Token rates, averaged over the last reporting window."""

    generated_tokens_per_second: float = Field(default=0.0, ge=0, description="Tokens/s generated.")
    trained_tokens_per_second: float = Field(default=0.0, ge=0, description="Tokens/s trained.")
    ratio: float = Field(default=0.0, ge=0, description="trained / generated tokens per second.")


class Progress(_Model):
    """What the coordinator reports in its Lease annotation `pipelinerl.io/progress` (JSON)."""

    step: int = Field(default=0, ge=0)
    weight_version: int = Field(default=0, ge=0)
    lag: Lag = Field(default_factory=Lag)
    reward: float | None = None
    throughput: Throughput = Field(default_factory=Throughput)
    finished: bool = False


class JobStatus(_Model):
    """`status` of a PipelineRLJob, written by the operator only."""

    phase: phases.Phase | None = Field(default=None, description="Lifecycle phase.")
    generators: int | None = Field(default=None, description="I: accelerators generating now.")
    trainers: int | None = Field(default=None, description="N - I: accelerators training now.")
    ready: str | None = Field(default=None, description="Worker pods ready / desired, e.g. 3/4.")
    step: int | None = Field(default=None, description="Optimizer steps done.")
    weight_version: int | None = Field(default=None, description="Weight version generators last received.")
    lag: Lag | None = Field(default=None, description="Policy lag of trained tokens, in optimizer steps.")
    reward: float | None = Field(default=None, description="Mean reward over the last optimizer step.")
    throughput: Throughput | None = Field(default=None, description="Generated and trained tokens/s.")
    restarts: int = Field(default=0, ge=0, description="Worker replacements so far.")
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


def parse(raw: dict[str, Any] | None) -> JobStatus:
    """The live status as our model; fields we do not own (e.g. kopf's) are ignored."""
    try:
        return JobStatus.model_validate(raw or {})
    except pydantic.ValidationError:
        return JobStatus()  # a hand-edited, broken status is recomputed from scratch


def current_generators(job: spec_mod.JobSpec, previous: JobStatus) -> int:
    """I to render: the spec's, else the one in effect (status), else the planner's initial one."""
    if job.pipeline.generators is not None:
        return job.pipeline.generators
    prev = previous.generators
    if prev is not None:
        try:
            common.Plan.of(job, prev)
            return prev
        except ValueError:
            pass  # N or GPUs per pod changed so that the old I no longer tiles
    return planner.initial_generators(job)


def _role(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("labels", {}).get(common.LABEL_ROLE, ""))


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
    job: spec_mod.PipelineRLJob, plan: common.Plan, children: Children
) -> tuple[phases.Observed, str]:
    """Reduce the children to the facts phases need, plus the scheduler's complaint (if any)."""
    suspended = job.spec.suspend
    want = {role: 0 if suspended else plan.pods(role) for role in common.ROLES}
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
    progress = progress_from_leases(children.leases)
    obs = phases.Observed(
        suspended=suspended,
        desired_pods=sum(want.values()),
        scheduled_pods=scheduled,
        ready_pods=ready,
        live_pods=len(children.pods),
        rolled_out=all(_rolled_out(children.statefulsets.get(r), want[r]) for r in common.ROLES),
        unschedulable=bool(complaint),
        succeeded=progress is not None and progress.finished,
    )
    return obs, complaint


def progress_from_leases(leases: list[dict[str, Any]]) -> Progress | None:
    """The coordinator's latest report, if any Lease carries one (the runtime's seam)."""
    for lease in leases:
        raw = lease.get("metadata", {}).get("annotations", {}).get(PROGRESS_ANNOTATION)
        if raw:
            try:
                return Progress.model_validate(json.loads(raw))
            except (ValueError, pydantic.ValidationError):
                continue
    return None


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
    since that pod was created (its predecessor's Lease says nothing about the new worker, which may
    still be loading its model). None (Unknown) while no worker reports at all.
    """
    pods = {
        str(p["metadata"].get("name")): _time(p["metadata"].get("creationTimestamp"))
        for p in children.pods
        if not p.get("metadata", {}).get("deletionTimestamp")
    }
    timeout = job.heartbeat.timeout_seconds
    fresh: list[str] = []
    stale: list[tuple[str, datetime.datetime]] = []
    for lease in children.leases:
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        renewed = _time(spec.get("renewTime"))
        if holder not in pods or renewed is None:
            continue
        created = pods[holder]
        if created is not None and renewed < created:
            continue
        if (now - renewed).total_seconds() > timeout:
            stale.append((holder, renewed))
        else:
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
) -> JobStatus:
    """The status the job should have now; equal to `previous` when nothing changed."""
    stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    plan = common.Plan.of(job.spec, generators)
    obs, complaint = observe(job, plan, children)
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
    progress = progress_from_leases(children.leases)
    start = previous.start_time or (stamp if phase is phases.Phase.RUNNING else None)
    done = previous.completion_time or (stamp if phase in phases.TERMINAL else None)
    return JobStatus(
        phase=phase,
        generators=plan.generator_gpus,
        trainers=plan.trainer_gpus,
        ready=f"{obs.ready_pods}/{obs.desired_pods}",
        step=progress.step if progress else previous.step,
        weight_version=progress.weight_version if progress else previous.weight_version,
        lag=progress.lag if progress else previous.lag,
        reward=progress.reward if progress else previous.reward,
        throughput=progress.throughput if progress else previous.throughput,
        restarts=previous.restarts,
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
