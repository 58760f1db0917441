"""The job's NetworkPolicy: workers accept connections from the job's own workers only.

Trainer rank 0 serves gRPC (token-checked) and two torch.distributed rendezvous stores that
check nothing; trainer ranks and generators open NCCL/gloo connections to each other on ports
chosen at run time. So the job's pods may reach each other on any port, and nothing else may
reach them, except the metrics port from the pods `spec.network.metricsFrom` names. Egress is
left open (the API server, model and dataset stores). Enforcement is the CNI's: a cluster
without a policy-enforcing CNI accepts the object and enforces nothing.

Neighbours: `render/workers.py` (the ports), `render/common.py` (names, labels, owner).
"""

from __future__ import annotations

from typing import Any

from plrl_api import names
from plrl_api import spec as spec_mod
from plrl_operator.render import common


def network_policy(job: spec_mod.PipelineRLJob) -> dict[str, Any]:
    workers = {"matchLabels": {names.LABEL_JOB: job.metadata.name}}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": workers}]}]
    scrapers = []
    for peer in job.spec.network.metrics_from:
        source: dict[str, Any] = {"podSelector": {"matchLabels": dict(sorted(peer.pod_selector.items()))}}
        if peer.namespace_selector:
            source["namespaceSelector"] = {"matchLabels": dict(sorted(peer.namespace_selector.items()))}
        scrapers.append(source)
    if scrapers:
        ingress.append({"from": scrapers, "ports": [{"protocol": "TCP", "port": names.PORT_METRICS}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": common.metadata(job, names.Names(job.metadata.name).network_policy),
        "spec": {"podSelector": workers, "policyTypes": ["Ingress"], "ingress": ingress},
    }
