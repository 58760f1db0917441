"""Every name the operator and the workers must agree on, defined once: labels, annotation keys,
environment variables, ports, roles, and the names of a job's child objects.

The operator renders pods and Services with these; the workers read their environment and renew
their Leases with them; the local runner sets the same environment for its processes. A name
that appears on both sides of the seam is written here and nowhere else (grep for the string).

Neighbours: `plrl_api.worker_config` (the file a worker reads), `plrl_api.identity` (the env a
worker reads), `plrl_api.records` (what travels in Lease annotations).
"""

from __future__ import annotations

import dataclasses
from typing import Final, Literal

# --------------------------------------------------------------------------- roles

Role = Literal["generator", "trainer"]
GENERATOR: Final = "generator"
TRAINER: Final = "trainer"
ROLES: Final[tuple[Role, Role]] = (GENERATOR, TRAINER)

# --------------------------------------------------------------------------- labels

LABEL_JOB: Final = "pipelinerl.io/job"
LABEL_CHECKPOINT_KEY_OF: Final = "pipelinerl.io/checkpoint-key-of"
"""On the job's checkpoint-key Secret instead of LABEL_JOB: it is not the job's child (it outlives
the job, so that a job re-created under the same name resumes the checkpoints it signed)."""
"""On every child object and Lease of a job: what the operator selects and watches them by."""
LABEL_ROLE: Final = "pipelinerl.io/role"
"""generator or trainer, on role objects (StatefulSets, Services, pods, Leases)."""
LABEL_POD_INDEX: Final = "apps.kubernetes.io/pod-index"
"""Set by the StatefulSet controller on each pod: its ordinal (the downward API exposes it)."""
MANAGED_BY: Final = "pipelinerl-operator"
"""Value of `app.kubernetes.io/managed-by` on the operator's objects."""
WORKER_CLUSTER_ROLE: Final = "pipelinerl-operator-worker"
"""The chart's ClusterRole for worker pods (Leases only) under `helm install pipelinerl-operator`;
another release name gives `<release>-worker`, which the chart passes to the operator."""

# --------------------------------------------------------------------------- annotations

ANNOTATION_DESIRED_HASH: Final = "pipelinerl.io/desired-hash"
"""Digest of an object's rendered content; the operator writes only when it differs."""
ANNOTATION_CONFIG_HASH: Final = "pipelinerl.io/config-hash"
"""On pod templates: digest of the worker config, so a config change rolls the pods."""
ANNOTATION_CREATE_ONLY: Final = "pipelinerl.io/create-only"
"""On objects the operator creates once and never rewrites (the token Secret)."""

# Lease annotations, written by each worker, read by the operator (`plrl_api.records`).
ANNOTATION_ROLE: Final = "pipelinerl.io/role"
ANNOTATION_WEIGHT_VERSION: Final = "pipelinerl.io/weight-version"
ANNOTATION_TOKENS_PER_SECOND: Final = "pipelinerl.io/tokens-per-second"
ANNOTATION_QUEUE_DEPTH: Final = "pipelinerl.io/queue-depth"
ANNOTATION_UTILISATION: Final = "pipelinerl.io/utilisation"
# Completion tokens per second of the time the worker was working (the autoscaler's capacity).
ANNOTATION_CAPACITY: Final = "pipelinerl.io/capacity-tokens-per-second"
ANNOTATION_PROGRESS: Final = "pipelinerl.io/progress"
"""Trainer rank 0 only: the job's `records.Progress` as JSON."""
ANNOTATION_RELEASED: Final = "pipelinerl.io/released"
"""`plrl run` only: the worker stopped renewing on purpose (it is exiting), so silence is no hang."""
ANNOTATION_POD_UID: Final = "pipelinerl.io/pod-uid"
"""On a worker's Lease: the uid of the pod whose process wrote it (a pod recreated under the same
name has a new one, so its predecessor's late renewals are told apart)."""

# --------------------------------------------------------------------------- environment

ENV_TOKEN_FILE: Final = "PLRL_TOKEN_FILE"
"""The file holding the job's RPC token (the job's Secret, mounted; `plrl run` writes one per run
into its run directory). A file, not the token itself: a process's environment is readable in
/proc/<pid>/environ and inherited by every process it starts."""
ENV_NAMESPACE: Final = "PLRL_NAMESPACE"
"""The pod's namespace (downward API); unset outside a cluster."""
ENV_POD_NAME: Final = "PLRL_POD_NAME"
"""The pod's name (downward API); its Lease is `<job>-<pod>`. Unset outside a cluster."""
ENV_POD_UID: Final = "PLRL_POD_UID"
"""The pod's uid (downward API), written on its Lease (`ANNOTATION_POD_UID`)."""
ENV_POD_INDEX: Final = "PLRL_POD_INDEX"
"""The pod's StatefulSet ordinal (downward API from `LABEL_POD_INDEX`)."""
ENV_LOCAL_RANK: Final = "PLRL_LOCAL_RANK"
"""Which accelerator of its pod a trainer process drives. Unset in a pod's first process, which
then starts one process per accelerator (torchrun-style) and sets it for each."""
ENV_BIND_HOST: Final = "PLRL_BIND_HOST"
"""Address servers listen on: a pod listens on all interfaces (unset); `plrl run` on loopback."""
ENV_METRICS_PORT: Final = "PLRL_WORKER_METRICS_PORT"
"""`plrl run` only: local processes share one IP, so each gets its own /metrics port."""

# --------------------------------------------------------------------------- exit codes

EXIT_RESTART_ME: Final = 75  # EX_TEMPFAIL
"""A worker that cannot go on through no fault of its own (it lost its coordinator, or a newer
process registered under its name) exits with this: restart it, but do not charge the restart to
`failurePolicy.maxRestarts` (the failure that caused it is charged). Never 0, which means done."""

# --------------------------------------------------------------------------- ports

PORT_RPC: Final = 50051
"""gRPC: the coordinator on trainer-0, the generator control service on each generator."""
PORT_RENDEZVOUS: Final = 29500
"""torch.distributed rendezvous among the trainer ranks."""
PORT_WEIGHT_SYNC: Final = 29600
"""Weight-broadcast group of trainer-0 and every generator."""
PORT_METRICS: Final = 9400
"""Prometheus /metrics on every worker."""

# --------------------------------------------------------------------------- files

CONFIG_DIR: Final = "/etc/plrl"
"""Where the job's ConfigMap is mounted in worker pods: `<CONFIG_DIR>/<role>.json`."""
TOKEN_KEY: Final = "token"
"""Key of the RPC token in the job's Secret."""
SECRET_DIR: Final = "/var/run/secrets/pipelinerl.io"
"""Where the job's Secret is mounted in worker pods (read-only), beside the ServiceAccount's."""
TOKEN_FILE: Final = f"{SECRET_DIR}/{TOKEN_KEY}"
SCRATCH_DIR: Final = "/var/tmp/plrl"
"""The one writable place in a worker pod besides /dev/shm and its volumes (the root filesystem is
read-only): HOME and TMPDIR, so caches (torch, triton, vLLM) and temporary files land there."""
WORKER_UID: Final = 1000
"""The user worker pods run as (the worker image's `plrl` user; Pod Security "restricted")."""
CHECKPOINT_KEY_KEY: Final = "checkpoint.key"
"""The checkpoint signing key (`checkpoint_manifest`), in the checkpoint-key Secret; mounted beside
the token."""
TLS_CA_KEY: Final = "ca.crt"
"""The job's own CA certificate (PEM), in the job's Secret beside the token; its key is not kept."""
TLS_CERT_KEY: Final = "tls.crt"
"""The coordinator's serving certificate (PEM), signed by the job's CA for `TLS_SERVER_NAME`."""
TLS_KEY_KEY: Final = "tls.key"
"""The coordinator certificate's private key (PEM)."""
TLS_SERVER_NAME: Final = "coordinator.pipelinerl.io"
"""The name generators expect the coordinator's certificate to carry, whatever address they dial
(pod DNS name or loopback): the job's own CA is what makes it this job's coordinator."""


def local_process(role: Role, index: int) -> str:
    """A `plrl run` process's name: `trainer-<rank>` or `generator-<index>` (its logs, heartbeat
    file and `--chaos` target are named by it)."""
    return f"{role}-{index}"


def config_file(role: Role) -> str:
    """The worker config file a pod of `role` reads."""
    return f"{CONFIG_DIR}/{role}.json"


# --------------------------------------------------------------------------- object names


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
    def checkpoint_key(self) -> str:
        """The Secret holding the key checkpoints are signed with; kept when the job is deleted."""
        return f"{self.job}-checkpoint-key"

    @property
    def network_policy(self) -> str:
        """The NetworkPolicy that keeps everyone but the job's own workers away from them."""
        return f"{self.job}-workers"

    @property
    def worker(self) -> str:
        """ServiceAccount of the worker pods."""
        return f"{self.job}-worker"

    @property
    def worker_binding(self) -> str:
        """RoleBinding of the worker ServiceAccount to the chart's worker ClusterRole. Not named
        `worker`: that was the binding to a per-job Role before, and a roleRef cannot change."""
        return f"{self.job}-worker-leases"

    def role(self, role: Role) -> str:
        """StatefulSet and headless Service of a role: `<job>-gen` / `<job>-train`."""
        return f"{self.job}-{'gen' if role == GENERATOR else 'train'}"

    def pod(self, role: Role, index: int) -> str:
        """The StatefulSet's pod `index` of `role`."""
        return f"{self.role(role)}-{index}"

    def lease(self, pod: str) -> str:
        """The heartbeat Lease a worker pod renews."""
        return f"{self.job}-{pod}"

    def dns(self, namespace: str, role: Role, index: int | None = None) -> str:
        """The headless Service's (or one of its pods') DNS name inside the cluster."""
        svc = self.role(role)
        host = f"{svc}-{index}.{svc}" if index is not None else svc
        return f"{host}.{namespace}.svc"
