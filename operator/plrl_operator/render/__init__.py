"""`render(job, generators) -> objects`: the desired Kubernetes objects of one PipelineRLJob.

Pure and deterministic: the same job, I and token give byte-identical output, in a fixed order
(config, RBAC, Services, StatefulSets: dependencies first, so applying in order never starts a
pod whose ConfigMap or ServiceAccount is missing). Every object carries its content hash
(`pipelinerl.io/desired-hash`) that `k8s.py` compares to skip unchanged writes.

Neighbours: `render.common`, `render.config`, `render.workers` (the builders);
`plrl_operator.handlers` and `plrl_operator.render_cli` (the callers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plrl_api import names, plan
from plrl_api import spec as spec_mod
from plrl_operator.render import common, config, network, workers


def render(
    job: spec_mod.PipelineRLJob,
    generators: int,
    *,
    token: str = common.TOKEN_PLACEHOLDER,
    tls: Mapping[str, bytes] | None = None,
    checkpoint_key: str = common.TOKEN_PLACEHOLDER,
    stopped: bool = False,
    worker_role: str = names.WORKER_CLUSTER_ROLE,
) -> list[dict[str, Any]]:
    """Every child object of `job` with I = `generators` accelerators generating.

    `token` is the job's RPC token; the operator passes the live Secret's value (or a fresh random
    one at creation), and at creation the job's TLS files (`certs.job_tls`; without them workers
    talk in plain text), and the checkpoint signing key (kept in a Secret that outlives the job).
    The default placeholders are for `plrl render` and golden tests. `stopped`
    (the job succeeded or failed) scales both StatefulSets to zero, like `spec.suspend`.
    `worker_role` is the ClusterRole the workers' RoleBinding grants (the chart's).
    """
    pod_plan = plan.PodPlan.of(job.spec, generators)
    cm = config.config_map(job, pod_plan)
    objects: list[dict[str, Any]] = [cm, config.token_secret(job, token, tls)]
    objects.append(config.checkpoint_key_secret(job, checkpoint_key))
    if job.spec.resources.service_account_name is None:
        objects += config.worker_rbac(job, worker_role)
    objects += [workers.service(job, role) for role in names.ROLES]
    if job.spec.network.network_policy:
        objects.append(network.network_policy(job))
    # Each role's pods roll only when their own config changes: a change of I rewrites the trainers'
    # (their world size) but not the generators', so adding or removing generators restarts none.
    objects += [
        workers.statefulset(job, pod_plan, role, common.content_hash(cm["data"][f"{role}.json"]), stopped)
        for role in names.ROLES
    ]
    # The Secret is create-only (see render.config); a digest of the token would only leak.
    return [
        obj
        if names.ANNOTATION_CREATE_ONLY in obj["metadata"].get("annotations", {})
        else common.with_hash(obj)
        for obj in objects
    ]
