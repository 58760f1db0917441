"""The worker pods: one headless Service and one StatefulSet per role (generator, trainer).

Each pod runs `plrl-worker --role <role> --config /etc/plrl/<role>.json`. Peers are found by the
headless Services' DNS names (in the config file) and the pod's StatefulSet ordinal (downward
API), never by hostfiles: trainer pod k holds ranks k * gpusPerTrainer onwards, and trainer-0
hosts the rendezvous, the coordinator and the weight-broadcast store.
Both StatefulSets use Parallel pod management, because rendezvous needs every rank up at once,
and publish not-ready addresses, because peers must resolve before anyone is Ready.

Neighbours: `render.common` (labels, affinity, resources), `render.config` (the files mounted).
"""

from __future__ import annotations

from typing import Any

from plrl_api import names, plan
from plrl_api import spec as spec_mod
from plrl_operator.render import common, config


def service(job: spec_mod.PipelineRLJob, role: names.Role) -> dict[str, Any]:
    ports = [
        {"name": "rpc", "port": names.PORT_RPC, "targetPort": names.PORT_RPC, "protocol": "TCP"},
        {
            "name": "metrics",
            "port": names.PORT_METRICS,
            "targetPort": names.PORT_METRICS,
            "protocol": "TCP",
        },
    ]
    if role == names.TRAINER:
        ports += [
            {
                "name": "rendezvous",
                "port": names.PORT_RENDEZVOUS,
                "targetPort": names.PORT_RENDEZVOUS,
                "protocol": "TCP",
            },
            {
                "name": "weight-sync",
                "port": names.PORT_WEIGHT_SYNC,
                "targetPort": names.PORT_WEIGHT_SYNC,
                "protocol": "TCP",
            },
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(job, names.Names(job.metadata.name).role(role), role),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": common.selector(job, role),
            "ports": ports,
        },
    }


def _env(job: spec_mod.PipelineRLJob) -> list[dict[str, Any]]:
    """Who the pod is (downward API) and where the job's token is mounted (`_volumes`); everything
    else is in the config file."""

    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    return [
        {"name": names.ENV_NAMESPACE, "valueFrom": field("metadata.namespace")},
        {"name": names.ENV_POD_NAME, "valueFrom": field("metadata.name")},
        {"name": names.ENV_POD_UID, "valueFrom": field("metadata.uid")},
        {"name": names.ENV_POD_INDEX, "valueFrom": field(f"metadata.labels['{names.LABEL_POD_INDEX}']")},
        {"name": names.ENV_TOKEN_FILE, "value": names.TOKEN_FILE},
        # The root filesystem is read-only: home and temporary files go to the scratch emptyDir.
        {"name": "HOME", "value": names.SCRATCH_DIR},
        {"name": "TMPDIR", "value": names.SCRATCH_DIR},
    ]


def _volumes(
    job: spec_mod.PipelineRLJob, role: names.Role
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): config files, the job's Secret, /dev/shm, scratch, and the spec's PVCs."""
    s = job.spec
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.Names(job.metadata.name).config}},
        # The token as a file, not an env var: env is readable in /proc and inherited by children;
        # beside it the TLS files and the checkpoint key (its own Secret: it outlives the job).
        {
            "name": "secret",
            "projected": {
                "sources": [
                    {"secret": {"name": names.Names(job.metadata.name).token}},
                    {"secret": {"name": names.Names(job.metadata.name).checkpoint_key}},
                ]
            },
        },
        # NCCL and vLLM move tensors through shared memory; the container default (64 MiB) is too small.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": names.CONFIG_DIR, "readOnly": True},
        {"name": "secret", "mountPath": names.SECRET_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "scratch", "mountPath": names.SCRATCH_DIR},
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
        mounts.append({"name": "dataset-cm", "mountPath": config.DATASET_DIR, "readOnly": True})
    if role == names.TRAINER and s.training.checkpoint.volume is not None:
        pvc("checkpoints", s.training.checkpoint.volume)
    return volumes, mounts


def statefulset(
    job: spec_mod.PipelineRLJob,
    pod_plan: plan.PodPlan,
    role: names.Role,
    config_hash: str,
    stopped: bool = False,
) -> dict[str, Any]:
    s = job.spec
    child = names.Names(job.metadata.name)
    gpus = pod_plan.gpus_per_pod(role)
    volumes, mounts = _volumes(job, role)
    ports = [
        {"name": "rpc", "containerPort": names.PORT_RPC, "protocol": "TCP"},
        {"name": "metrics", "containerPort": names.PORT_METRICS, "protocol": "TCP"},
    ]
    if role == names.TRAINER:
        ports += [
            {"name": "rendezvous", "containerPort": names.PORT_RENDEZVOUS, "protocol": "TCP"},
            {"name": "weight-sync", "containerPort": names.PORT_WEIGHT_SYNC, "protocol": "TCP"},
        ]
    container: dict[str, Any] = {
        "name": role,
        "image": s.resources.image,
        "imagePullPolicy": s.resources.image_pull_policy,
        "command": ["plrl-worker", "--role", role, "--config", names.config_file(role)],
        "env": _env(job),
        "ports": ports,
        "resources": common.resources(s, gpus),
        "volumeMounts": mounts,
        # Pod Security "restricted" (with the pod's securityContext below), and a read-only root.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
        # A worker that fails before writing a termination message (a bad config, a missing model)
        # still says why: the kubelet takes its last log lines, and the job's Failed condition and
        # WorkerRestarted events quote them.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": s.resources.service_account_name or child.worker,
        "affinity": common.gpu_affinity(s),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": names.WORKER_UID,
            "runAsGroup": names.WORKER_UID,
            "fsGroup": names.WORKER_UID,  # volumes (the Secret's files, scratch) readable by it
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
        # On SIGTERM workers stop between optimizer steps and decode steps (a trainer resumes from its
        # latest checkpoint; a generator's leases go back to the queue); give them time to get there.
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
        "metadata": common.metadata(job, child.role(role), role),
        "spec": {
            "serviceName": child.role(role),
            "replicas": 0 if s.suspend or stopped else pod_plan.pods(role),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": common.selector(job, role)},
            "template": {
                "metadata": {
                    "labels": common.labels(job, role),
                    # A config change alone would not restart pods; the hash makes it a template change.
                    "annotations": {names.ANNOTATION_CONFIG_HASH: config_hash},
                },
                "spec": pod_spec,
            },
        },
    }
