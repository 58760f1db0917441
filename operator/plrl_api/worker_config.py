"""`WorkerConfig`: the one file a worker reads (`/etc/plrl/<role>.json`), and the one way to build it.

The operator renders it into the job's ConfigMap (`plrl_operator.render.config`) with the headless
Services' DNS names as endpoints and the pod's volume paths; `plrl run` writes the same document
per role into the run directory with loopback endpoints and run-directory paths. Both call
`build`, so the two can differ only in `endpoints` and `paths`. Unknown fields are refused: a field
the operator renders that no worker reads is a bug, not something to ignore.

Which replica a process is comes from its environment (`plrl_api.identity`), not from this file,
so every pod of a role mounts the same file.

Neighbours: `plrl_api.spec` (the job inside), `plrl_api.plan` (pods per role),
`plrl_workers.generator` / `plrl_workers.trainer` (the readers).
"""

from __future__ import annotations

import json
import pathlib
from typing import Literal

import pydantic
from pydantic.alias_generators import to_camel

from plrl_api import names, plan
from plrl_api import spec as spec_mod


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class JobRef(_Model):
    """The job this worker belongs to (its Lease is owned by the job's uid, when there is one)."""

    name: str
    namespace: str | None = None
    uid: str | None = None


class Endpoints(_Model):
    """Where a worker finds its peers (`host:port`) and serves /metrics."""

    coordinator: str
    """Trainer rank 0's gRPC service (prompt leases, rollouts, control, weight pulls)."""
    rendezvous: str
    """torch.distributed rendezvous of the trainer ranks (rank 0 hosts it)."""
    weight_sync: str
    """The weight-broadcast group's store on trainer rank 0."""
    metrics_port: int = pydantic.Field(ge=0, le=65_535)
    """Port of each worker's Prometheus /metrics (`plrl run` gives each process its own instead)."""
    collective_backend: Literal["gloo", "nccl"] | None = None
    """Backend of the trainer group and the weight broadcast; None: NCCL on CUDA, gloo on CPU.
    `plrl run` says gloo when its processes share a GPU (NCCL refuses two ranks on one device)."""

    @pydantic.field_validator("coordinator", "rendezvous", "weight_sync")
    @classmethod
    def _host_port(cls, v: str) -> str:
        split_host_port(v)
        return v


class Paths(_Model):
    """Where a worker finds its files."""

    model_dir: str
    """The initial model (Hugging Face directory) every worker loads."""
    checkpoint_dir: str
    """Trainer checkpoints (read on start to resume, written every `checkpoint.everySteps`)."""
    dataset_file: str | None = None
    """The JSONL prompts of a `jsonl` task (a path in the pod, or the job file's path resolved by
    `plrl run`); None for builtin tasks."""
    run_dir: str | None = None
    """Where trainer rank 0 appends `metrics.jsonl`: `plrl run`'s run directory; in a cluster the
    checkpoint directory (on the checkpoint volume, so the records outlive the pods)."""


PodPlan = plan.PodPlan  # by this name too: the field `plan` below hides the module in the class body


class WorkerConfig(_Model):
    role: names.Role
    job: JobRef
    spec: spec_mod.JobSpec
    """The fully defaulted spec without the fields only the controllers act on (`NOT_FOR_WORKERS`)."""
    plan: PodPlan | None = None
    """Trainers only: pods and accelerators per role (their world size). Generators get none, so
    their file, and with it their pods, stays the same when I changes."""
    endpoints: Endpoints
    paths: Paths

    def pods(self) -> PodPlan:
        """The pod plan; only a trainer's config has one."""
        if self.plan is None:
            raise ValueError(f"the {self.role} config has no pod plan (only trainers' configs do)")
        return self.plan


NOT_FOR_WORKERS = {"suspend", "network"}
"""Spec fields left out of the file: suspending is the controller's business and `network` the
NetworkPolicy's; leaving them out keeps a suspend/resume or a new scraper from changing the file
and rolling the pods."""


def build(
    job: spec_mod.PipelineRLJob,
    pod_plan: plan.PodPlan,
    role: names.Role,
    endpoints: Endpoints,
    paths: Paths,
) -> WorkerConfig:
    """The config a worker of `role` reads; the operator and `plrl run` differ only in the last two."""
    spec = spec_mod.JobSpec.model_validate(job.spec.model_dump(exclude=NOT_FOR_WORKERS))
    return WorkerConfig(
        role=role,
        job=JobRef(name=job.metadata.name, namespace=job.metadata.namespace, uid=job.metadata.uid),
        spec=spec,
        plan=pod_plan if role == names.TRAINER else None,
        endpoints=endpoints,
        paths=paths,
    )


def dump(cfg: WorkerConfig) -> str:
    """The file's text: camelCase JSON with sorted keys (stable, so its digest is too)."""
    doc = cfg.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"spec": NOT_FOR_WORKERS})
    return json.dumps(doc, indent=2, sort_keys=True)


class ConfigError(ValueError):
    """A worker config that cannot be read; the message names the file and the field."""


def load(path: str | pathlib.Path) -> WorkerConfig:
    """Read a worker config file; errors name the file and the field."""
    p = pathlib.Path(path)
    try:
        return WorkerConfig.model_validate_json(p.read_bytes())
    except OSError as err:
        raise ConfigError(f"{p}: cannot read worker config: {err.strerror}") from None
    except pydantic.ValidationError as err:
        raise ConfigError(f"{p}: invalid worker config:\n{spec_mod.format_validation_error(err)}") from None


def split_host_port(addr: str) -> tuple[str, int]:
    """`host:port` -> (host, port); ValueError naming the address otherwise."""
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65_536:
        raise ValueError(f"expected host:port, got {addr!r}")
    return host, int(port)
