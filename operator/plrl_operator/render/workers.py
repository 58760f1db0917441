"""The worker pods: one headless Service and one StatefulSet per role (generator, trainer).

Each pod runs `python -m plrl_workers.<role> --config /etc/plrl/<role>.json`. Peers are found by
the headless Services' DNS names and the StatefulSet pod index (downward API), never by
hostfiles: trainer rank r is pod `<job>-train-r`, trainer-0 is rendezvous master and coordinator.
Both StatefulSets use Parallel pod management, because rendezvous needs every rank up at once,
and publish not-ready addresses, because peers must resolve before anyone is Ready.

Neighbours: `render.common` (labels, affinity, resources), `render.config` (the files mounted).
"""

from __future__ import annotations

from typing import Any

from plrl_operator import spec as spec_mod
from plrl_operator.render import common


def service(job: spec_mod.PipelineRLJob, role: str) -> dict[str, Any]:
    ports = [
        {"name": "rpc", "port": common.PORT_RPC, "targetPort": common.PORT_RPC, "protocol": "TCP"},
        {
            "name": "metrics",
            "port": common.PORT_METRICS,
            "targetPort": common.PORT_METRICS,
            "protocol": "TCP",
        },
    ]
    if role == common.TRAINER:
        ports += [
            {
                "name": "rendezvous",
                "port": common.PORT_RENDEZVOUS,
                "targetPort": common.PORT_RENDEZVOUS,
                "protocol": "TCP",
            },
            {
                "name": "weight-sync",
                "port": common.PORT_WEIGHT_SYNC,
                "targetPort": common.PORT_WEIGHT_SYNC,
                "protocol": "TCP",
            },
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(job, common.Names(job.metadata.name).role(role), role),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": common.selector(job, role),
            "ports": ports,
        },
    }


def _env(job: spec_mod.PipelineRLJob, plan: common.Plan, role: str) -> list[dict[str, Any]]:
    names = common.Names(job.metadata.name)
    train = names.role(common.TRAINER)
    master = f"{train}-0.{train}.$(PLRL_NAMESPACE).svc"
    gpus = (
        job.spec.resources.gpus_per_generator
        if role == common.GENERATOR
        else job.spec.resources.gpus_per_trainer
    )
    env: list[dict[str, Any]] = [
        {"name": "PLRL_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "PLRL_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": "PLRL_POD_INDEX",
            "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.labels['{common.STATEFULSET_POD_INDEX_LABEL}']"}
            },
        },
        {"name": "PLRL_JOB", "value": job.metadata.name},
        {"name": "PLRL_ROLE", "value": role},
        {
            "name": "PLRL_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": names.token, "key": common.TOKEN_KEY}},
        },
        {"name": "PLRL_COORDINATOR", "value": f"{master}:{common.PORT_RPC}"},
        {"name": "PLRL_WEIGHT_SYNC_ADDR", "value": f"{master}:{common.PORT_WEIGHT_SYNC}"},
        {"name": "PLRL_GPUS_PER_POD", "value": str(gpus)},
    ]
    if role == common.TRAINER:
        # torch.distributed's env:// rendezvous; NODE_RANK is this pod's StatefulSet ordinal.
        env += [
            {"name": "MASTER_ADDR", "value": master},
            {"name": "MASTER_PORT", "value": str(common.PORT_RENDEZVOUS)},
            {"name": "NNODES", "value": str(plan.trainer_pods)},
            {"name": "NPROC_PER_NODE", "value": str(gpus)},
            {"name": "NODE_RANK", "value": "$(PLRL_POD_INDEX)"},
            {"name": "WORLD_SIZE", "value": str(plan.trainer_gpus)},
        ]
    else:
        env += [
            {"name": "PLRL_GENERATOR_PODS", "value": str(plan.generator_pods)},
            {"name": "PLRL_TENSOR_PARALLEL", "value": str(gpus)},
        ]
    return env


def _volumes(job: spec_mod.PipelineRLJob, role: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): config files, the token-free /dev/shm, and the spec's PVCs."""
    s = job.spec
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": common.Names(job.metadata.name).config}},
        # NCCL and vLLM move tensors through shared memory; the container default (64 MiB) is too small.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": common.CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]

    def pvc(name: str, vol: spec_mod.VolumeSource) -> None:
        volumes.append(
            {"name": name, "persistentVolumeClaim": {"claimName": vol.claim_name, "readOnly": vol.read_only}}
        )
        mount: dict[str, Any] = {"name": name, "mountPath": vol.mount_path, "readOnly": vol.read_only}
        if vol.sub_path:
            mount["subPath"] = vol.sub_path
        mounts.append(mount)

    if s.model.volume is not None:
        pvc("model", s.model.volume)
    dataset = s.task.dataset
    if dataset is not None and dataset.volume is not None:
        pvc("dataset", dataset.volume)
    if dataset is not None and dataset.config_map is not None:
        volumes.append({"name": "dataset-cm", "configMap": {"name": dataset.config_map.name}})
        mounts.append({"name": "dataset-cm", "mountPath": f"{common.CONFIG_DIR}/dataset", "readOnly": True})
    if role == common.TRAINER and s.training.checkpoint.volume is not None:
        pvc("checkpoints", s.training.checkpoint.volume)
    return volumes, mounts


def statefulset(
    job: spec_mod.PipelineRLJob, plan: common.Plan, role: str, config_hash: str
) -> dict[str, Any]:
    s = job.spec
    names = common.Names(job.metadata.name)
    gpus = s.resources.gpus_per_generator if role == common.GENERATOR else s.resources.gpus_per_trainer
    volumes, mounts = _volumes(job, role)
    ports = [
        {"name": "rpc", "containerPort": common.PORT_RPC, "protocol": "TCP"},
        {"name": "metrics", "containerPort": common.PORT_METRICS, "protocol": "TCP"},
    ]
    if role == common.TRAINER:
        ports += [
            {"name": "rendezvous", "containerPort": common.PORT_RENDEZVOUS, "protocol": "TCP"},
            {"name": "weight-sync", "containerPort": common.PORT_WEIGHT_SYNC, "protocol": "TCP"},
        ]
    container: dict[str, Any] = {
        "name": role,
        "image": s.resources.image,
        "imagePullPolicy": s.resources.image_pull_policy,
        "command": ["python", "-m", f"plrl_workers.{role}", "--config", f"{common.CONFIG_DIR}/{role}.json"],
        "env": _env(job, plan, role),
        "ports": ports,
        "resources": common.resources(s, gpus),
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": s.resources.service_account_name or names.worker,
        "affinity": common.gpu_affinity(s),
        "containers": [container],
        "volumes": volumes,
        # Workers checkpoint and hand back prompt leases on SIGTERM; give them time.
        "terminationGracePeriodSeconds": 60,
    }
    if s.resources.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(s.resources.node_selector.items()))
    tolerations = common.tolerations(s)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": common.metadata(job, names.role(role), role),
        "spec": {
            "serviceName": names.role(role),
            "replicas": 0 if s.suspend else plan.pods(role),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": common.selector(job, role)},
            "template": {
                "metadata": {
                    "labels": common.labels(job, role),
                    # A config change alone would not restart pods; the hash makes it a template change.
                    "annotations": {common.ANNOTATION_CONFIG_HASH: config_hash},
                },
                "spec": pod_spec,
            },
        },
    }
