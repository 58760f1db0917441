"""The job's non-pod objects: resolved-config ConfigMap, RPC-token Secret, worker RBAC.

The ConfigMap holds one JSON file per role (`/etc/plrl/<role>.json`): the fully defaulted spec,
the plan (how many pods of each role) and the endpoints a worker needs to find its peers, all
derived from the job. Workers read only that file and their env; nothing is passed by hostfile.

Secret: the per-job token every worker RPC must carry. It is random and therefore cannot be a
pure function of the job; `render` takes it as an argument and the operator creates the Secret
only when it is absent (annotation `pipelinerl.io/create-only`), reading the live value back on
every later reconcile, so re-rendering never rotates it. Deleting the Secret rotates it.

Neighbours: `render.common` (names, labels), `render.workers` (pods that mount these).
"""

from __future__ import annotations

import json
from typing import Any

from plrl_operator import spec as spec_mod
from plrl_operator.render import common


def _dns(names: common.Names, namespace: str, role: str, pod_index: int | None = None) -> str:
    """A headless Service's (or one of its pods') DNS name inside the cluster."""
    svc = names.role(role)
    host = f"{svc}-{pod_index}.{svc}" if pod_index is not None else svc
    return f"{host}.{namespace}.svc"


def worker_config(job: spec_mod.PipelineRLJob, plan: common.Plan, role: str) -> dict[str, Any]:
    """What `/etc/plrl/<role>.json` holds: everything a worker needs besides its pod index and token."""
    names = common.Names(job.metadata.name)
    ns = job.metadata.namespace or "default"
    return {
        "role": role,
        "job": {"name": job.metadata.name, "namespace": job.metadata.namespace, "uid": job.metadata.uid},
        # suspend is the operator's business; leaving it out keeps a suspend/resume from rolling pods.
        "spec": job.spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"suspend"}),
        "plan": {
            "generatorGPUs": plan.generator_gpus,
            "trainerGPUs": plan.trainer_gpus,
            "generatorPods": plan.generator_pods,
            "trainerPods": plan.trainer_pods,
        },
        "endpoints": {
            "coordinator": f"{_dns(names, ns, common.TRAINER, 0)}:{common.PORT_RPC}",
            "rendezvous": f"{_dns(names, ns, common.TRAINER, 0)}:{common.PORT_RENDEZVOUS}",
            "weightSync": f"{_dns(names, ns, common.TRAINER, 0)}:{common.PORT_WEIGHT_SYNC}",
            "generatorService": _dns(names, ns, common.GENERATOR),
            "trainerService": _dns(names, ns, common.TRAINER),
        },
        "ports": {
            "rpc": common.PORT_RPC,
            "rendezvous": common.PORT_RENDEZVOUS,
            "weightSync": common.PORT_WEIGHT_SYNC,
            "metrics": common.PORT_METRICS,
        },
        "tokenEnv": "PLRL_TOKEN",
        "lease": {"namePrefix": f"{job.metadata.name}-", "labels": {common.LABEL_JOB: job.metadata.name}},
    }


def config_map(job: spec_mod.PipelineRLJob, plan: common.Plan) -> dict[str, Any]:
    data = {
        f"{role}.json": json.dumps(worker_config(job, plan, role), indent=2, sort_keys=True)
        for role in common.ROLES
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": common.metadata(job, common.Names(job.metadata.name).config),
        "data": data,
    }


def token_secret(job: spec_mod.PipelineRLJob, token: str) -> dict[str, Any]:
    meta = common.metadata(job, common.Names(job.metadata.name).token)
    meta["annotations"] = {common.ANNOTATION_CREATE_ONLY: "true"}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "stringData": {common.TOKEN_KEY: token},
    }


def worker_rbac(job: spec_mod.PipelineRLJob) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding that let workers renew their Leases `<job>-<pod>`.

    `create` cannot be limited by name in RBAC, so the Role covers Leases in the namespace.
    """
    name = common.Names(job.metadata.name).worker
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": common.metadata(job, name)}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": common.metadata(job, name),
        "rules": [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "list", "watch", "create", "update", "patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": common.metadata(job, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, **_ns(job)}],
    }
    return [sa, role, binding]


def _ns(job: spec_mod.PipelineRLJob) -> dict[str, str]:
    return {"namespace": job.metadata.namespace} if job.metadata.namespace else {}
