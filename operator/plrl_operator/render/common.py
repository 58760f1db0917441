"""Names, labels, owner references, hashes and pod-level helpers shared by every builder.

Everything here is a pure function of the job. Child names are derived from the job's name only
(never from hostnames or cluster facts), so a retry or a restarted operator renders the same
objects. Neighbours: `render.config` (ConfigMap, Secret, RBAC), `render.workers` (Services and
StatefulSets), `render.__init__` (the entry point and ordering).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from plrl_operator import spec as spec_mod

MANAGER = "pipelinerl-operator"
LABEL_JOB = "pipelinerl.io/job"
LABEL_ROLE = "pipelinerl.io/role"
ANNOTATION_HASH = "pipelinerl.io/desired-hash"
ANNOTATION_CONFIG_HASH = "pipelinerl.io/config-hash"
ANNOTATION_CREATE_ONLY = "pipelinerl.io/create-only"

GENERATOR = "generator"
TRAINER = "trainer"
ROLES = (GENERATOR, TRAINER)

# Container ports. Fixed per pod (each pod has its own IP), so peers find them without lookups.
PORT_RPC = 50051  # gRPC: coordinator on trainer-0, generator control on each generator
PORT_RENDEZVOUS = 29500  # torch.distributed rendezvous among trainers (MASTER_PORT)
PORT_WEIGHT_SYNC = 29600  # weight-broadcast group: trainer-0 and every generator
PORT_METRICS = 9400  # Prometheus /metrics on every worker

CONFIG_DIR = "/etc/plrl"
TOKEN_KEY = "token"
TOKEN_PLACEHOLDER = "generated-by-the-operator-at-creation"
STATEFULSET_POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"


@dataclasses.dataclass(frozen=True)
class Names:
    """Every child object's name, derived from the job's name (a DNS label of <= 40 chars)."""

    job: str

    @property
    def config(self) -> str:
        return f"{self.job}-config"

    @property
    def token(self) -> str:
        return f"{self.job}-token"

    @property
    def worker(self) -> str:
        """ServiceAccount, Role and RoleBinding of the worker pods."""
        return f"{self.job}-worker"

    def role(self, role: str) -> str:
        """StatefulSet and headless Service of a role: `<job>-gen` / `<job>-train`."""
        return f"{self.job}-{'gen' if role == GENERATOR else 'train'}"


@dataclasses.dataclass(frozen=True)
class Plan:
    """How many pods of each role the job gets, from N, I and the GPUs per pod."""

    generator_gpus: int
    trainer_gpus: int
    generator_pods: int
    trainer_pods: int

    @staticmethod
    def of(job: spec_mod.JobSpec, generators: int) -> Plan:
        r = job.resources
        if not 0 < generators < r.total_gpus:
            raise ValueError(
                f"generators={generators} must be between 1 and resources.totalGPUs - 1 = {r.total_gpus - 1}"
            )
        if generators % r.gpus_per_generator or (r.total_gpus - generators) % r.gpus_per_trainer:
            raise ValueError(
                f"generators={generators} does not tile: it must be a multiple of gpusPerGenerator="
                f"{r.gpus_per_generator} and leave a multiple of gpusPerTrainer={r.gpus_per_trainer}"
            )
        trainer_gpus = r.total_gpus - generators
        return Plan(
            generator_gpus=generators,
            trainer_gpus=trainer_gpus,
            generator_pods=generators // r.gpus_per_generator,
            trainer_pods=trainer_gpus // r.gpus_per_trainer,
        )

    def pods(self, role: str) -> int:
        return self.generator_pods if role == GENERATOR else self.trainer_pods


def labels(job: spec_mod.PipelineRLJob, role: str | None = None) -> dict[str, str]:
    """Labels on every child; `pipelinerl.io/job` is what the operator selects children by."""
    out = {
        "app.kubernetes.io/name": "pipelinerl",
        "app.kubernetes.io/instance": job.metadata.name,
        "app.kubernetes.io/managed-by": MANAGER,
        LABEL_JOB: job.metadata.name,
    }
    if role is not None:
        out["app.kubernetes.io/component"] = role
        out[LABEL_ROLE] = role
    return out


def selector(job: spec_mod.PipelineRLJob, role: str) -> dict[str, str]:
    """The immutable part of the labels: what a StatefulSet or Service selects its pods by."""
    return {LABEL_JOB: job.metadata.name, LABEL_ROLE: role}


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


def metadata(job: spec_mod.PipelineRLJob, name: str, role: str | None = None) -> dict[str, Any]:
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
    annotations.pop(ANNOTATION_HASH, None)
    annotations[ANNOTATION_HASH] = content_hash(obj)
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
