"""Labels, owner references, hashes and pod-level helpers shared by every builder.

Everything here is a pure function of the job. Child names (`plrl_api.names.Names`) derive from the
job's name only (never from hostnames or cluster facts), so a retry or a restarted operator renders the same
objects. Neighbours: `render.config` (ConfigMap, Secret, RBAC), `render.workers` (Services and
StatefulSets), `render.__init__` (the entry point and ordering).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from plrl_api import names
from plrl_api import spec as spec_mod

TOKEN_PLACEHOLDER = "generated-by-the-operator-at-creation"
"""The token `plrl render` and golden files show; the operator renders the live Secret's value."""


def labels(job: spec_mod.PipelineRLJob, role: names.Role | None = None) -> dict[str, str]:
    """Labels on every child; `pipelinerl.io/job` is what the operator selects children by."""
    out = {
        "app.kubernetes.io/name": "pipelinerl",
        "app.kubernetes.io/instance": job.metadata.name,
        "app.kubernetes.io/managed-by": names.MANAGED_BY,
        names.LABEL_JOB: job.metadata.name,
    }
    if role is not None:
        out["app.kubernetes.io/component"] = role
        out[names.LABEL_ROLE] = role
    return out


def selector(job: spec_mod.PipelineRLJob, role: names.Role) -> dict[str, str]:
    """The immutable part of the labels: what a StatefulSet or Service selects its pods by."""
    return {names.LABEL_JOB: job.metadata.name, names.LABEL_ROLE: role}


def owner_references(job: spec_mod.PipelineRLJob) -> list[dict[str, Any]]:
    """The job as controller owner, so deleting it garbage-collects every child.

    A job read from a file has no uid yet (`plrl render`); its children then carry no owner.
    """
    if not job.metadata.uid:
        return []
    return [
        {
            "apiVersion": job.api_version,
            "kind": job.kind,
            "name": job.metadata.name,
            "uid": job.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def metadata(job: spec_mod.PipelineRLJob, name: str, role: names.Role | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if job.metadata.namespace:
        meta["namespace"] = job.metadata.namespace
    meta["labels"] = labels(job, role)
    owners = owner_references(job)
    if owners:
        meta["ownerReferences"] = owners
    return meta


def content_hash(value: Any) -> str:
    """A short stable digest of JSON-able data (sorted keys), for change detection."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """Stamp `obj` with the digest of its own desired content.

    The operator compares this annotation with the live object's and writes only on a
    difference, so re-reconciling an unchanged job issues no write at all.
    """
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations.pop(names.ANNOTATION_DESIRED_HASH, None)
    annotations[names.ANNOTATION_DESIRED_HASH] = content_hash(obj)
    return obj


def gpu_affinity(job: spec_mod.JobSpec) -> dict[str, Any]:
    """The user's affinity with a required GPU-presence term added to every node selector term.

    Node selector terms are ORed and expressions within one are ANDed, so the GPU expression
    goes into each of the user's terms (or forms the only term).
    """
    gpu_expr = {"key": f"{job.resources.gpu_resource_name}.present", "operator": "In", "values": ["true"]}
    affinity: dict[str, Any] = json.loads(json.dumps(job.resources.affinity or {}))
    node = affinity.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term["matchExpressions"] = [*term.get("matchExpressions", []), dict(gpu_expr)]
    required["nodeSelectorTerms"] = terms
    return affinity


def tolerations(job: spec_mod.JobSpec) -> list[dict[str, Any]]:
    return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in job.resources.tolerations]


def resources(job: spec_mod.JobSpec, gpus: int) -> dict[str, Any]:
    """Requests and limits of one worker container; extended resources need limit == request."""
    r = job.resources
    return {
        "requests": {"cpu": r.cpu, "memory": r.memory, r.gpu_resource_name: str(gpus)},
        "limits": {"memory": r.memory, r.gpu_resource_name: str(gpus)},
    }
