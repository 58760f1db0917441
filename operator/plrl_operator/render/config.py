"""The job's non-pod objects: resolved-config ConfigMap, RPC-token Secret, worker RBAC.

The ConfigMap holds one `plrl_api.worker_config.WorkerConfig` per role (`/etc/plrl/<role>.json`):
the fully defaulted spec, the pod plan, the endpoints a worker finds its peers at (the headless
Services' DNS names) and the paths of its files in the pod (step records go to the checkpoint
directory, beside the checkpoints). Workers read only that file and their env; nothing is passed by
hostfile.

Secret: the per-job token every worker RPC must carry. It is random and therefore cannot be a
pure function of the job; `render` takes it as an argument and the operator creates the Secret
only when it is absent (annotation `pipelinerl.io/create-only`), reading the live value back on
every later reconcile, so re-rendering never rotates it. Deleting the Secret rotates it.

Neighbours: `render.common` (names, labels), `render.workers` (pods that mount these).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plrl_api import names, plan, worker_config
from plrl_api import spec as spec_mod
from plrl_operator.render import common

DATASET_DIR = f"{names.CONFIG_DIR}/dataset"
"""Where a dataset ConfigMap is mounted (`render.workers`)."""


def endpoints(job: spec_mod.PipelineRLJob) -> worker_config.Endpoints:
    """Peers by the headless Services' DNS names: trainer-0 hosts the coordinator and both stores."""
    trainer0 = names.Names(job.metadata.name).dns(job.metadata.namespace or "default", names.TRAINER, 0)
    return worker_config.Endpoints(
        coordinator=f"{trainer0}:{names.PORT_RPC}",
        rendezvous=f"{trainer0}:{names.PORT_RENDEZVOUS}",
        weight_sync=f"{trainer0}:{names.PORT_WEIGHT_SYNC}",
        metrics_port=names.PORT_METRICS,
    )


def paths(job: spec_mod.PipelineRLJob) -> worker_config.Paths:
    """The pod's view of its files: the model and checkpoints where the spec mounts them."""
    s = job.spec
    ds = s.task.dataset
    dataset: str | None = None
    if ds is not None:
        dataset = f"{DATASET_DIR}/{ds.config_map.key}" if ds.config_map is not None else ds.path
    # Trainer rank 0 appends its step records (metrics.jsonl) beside the checkpoints: the volume
    # that outlives the pods holds the job's history too (`plrl status <dir>` reads it).
    return worker_config.Paths(
        model_dir=s.model.name,
        checkpoint_dir=s.training.checkpoint.path,
        dataset_file=dataset,
        run_dir=s.training.checkpoint.path,
    )


def config_map(job: spec_mod.PipelineRLJob, pod_plan: plan.PodPlan) -> dict[str, Any]:
    data = {
        f"{role}.json": worker_config.dump(
            worker_config.build(job, pod_plan, role, endpoints(job), paths(job))
        )
        for role in names.ROLES
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": common.metadata(job, names.Names(job.metadata.name).config),
        "data": data,
    }


def token_secret(
    job: spec_mod.PipelineRLJob, token: str, tls: Mapping[str, bytes] | None = None
) -> dict[str, Any]:
    """The job's Secret: its RPC token and, from the operator, its TLS files (`certs.job_tls`)."""
    meta = common.metadata(job, names.Names(job.metadata.name).token)
    meta["annotations"] = {names.ANNOTATION_CREATE_ONLY: "true"}
    data = {names.TOKEN_KEY: token} | {k: v.decode() for k, v in (tls or {}).items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "stringData": data}


def checkpoint_key_secret(job: spec_mod.PipelineRLJob, key: str) -> dict[str, Any]:
    """The key checkpoints are signed with (`checkpoint_manifest`). Not owned by the job: deleting
    the job keeps it, as it keeps the checkpoint volume, so the job applied again resumes; delete
    the Secret to have a re-created job refuse the old checkpoints."""
    meta: dict[str, Any] = {"name": names.Names(job.metadata.name).checkpoint_key}
    if job.metadata.namespace:
        meta["namespace"] = job.metadata.namespace
    meta["labels"] = {names.LABEL_CHECKPOINT_KEY_OF: job.metadata.name}
    meta["annotations"] = {names.ANNOTATION_CREATE_ONLY: "true"}
    data = {names.CHECKPOINT_KEY_KEY: key}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "stringData": data}


def worker_rbac(job: spec_mod.PipelineRLJob, worker_role: str) -> list[dict[str, Any]]:
    """ServiceAccount of the workers, and the RoleBinding that grants them `worker_role` (the chart's
    ClusterRole: renew their Leases `<job>-<pod>`) in the job's namespace only. The operator
    writes no Role: it may bind that one ClusterRole, and nothing else."""
    child = names.Names(job.metadata.name)
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": common.metadata(job, child.worker)}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": common.metadata(job, child.worker_binding),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": worker_role},
        "subjects": [{"kind": "ServiceAccount", "name": child.worker, **_ns(job)}],
    }
    return [sa, binding]


def _ns(job: spec_mod.PipelineRLJob) -> dict[str, str]:
    return {"namespace": job.metadata.namespace} if job.metadata.namespace else {}
