"""Prometheus metrics of the operator, served on their own port (`settings.metrics_port`).

Counters are incremented where the event happens (`k8s.py` for API requests, `handlers.py` for
reconciles and admission reviews); `jobs by phase` is a gauge recomputed from the handlers' view of every job.
Neighbours: `plrl_operator.k8s`, `plrl_operator.handlers`.
"""

from __future__ import annotations

import prometheus_client

RECONCILES = prometheus_client.Counter(
    "plrl_operator_reconciles_total", "Reconciles of PipelineRLJobs by trigger", ["trigger"]
)
RECONCILE_ERRORS = prometheus_client.Counter(
    "plrl_operator_reconcile_errors_total",
    "Reconciles that raised, by trigger and kind of error",
    ["trigger", "error"],
)
RECONCILE_SECONDS = prometheus_client.Histogram(
    "plrl_operator_reconcile_duration_seconds",
    "Wall time of one reconcile (render, list, writes)",
    ["trigger"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
API_REQUESTS = prometheus_client.Counter(
    "plrl_operator_api_requests_total", "Kubernetes API requests made by plrl_operator.k8s", ["verb", "kind"]
)
API_ERRORS = prometheus_client.Counter(
    "plrl_operator_api_errors_total", "Kubernetes API requests that failed", ["verb", "kind", "code"]
)
OBJECT_WRITES = prometheus_client.Counter(
    "plrl_operator_object_writes_total", "Child objects written (created or changed) by kind", ["kind"]
)
STATUS_WRITES = prometheus_client.Counter(
    "plrl_operator_status_writes_total", "Status patches of PipelineRLJobs (only on change)"
)
ADMISSION_REVIEWS = prometheus_client.Counter(
    "plrl_operator_admission_reviews_total",
    "PipelineRLJob creates and updates reviewed by the admission webhook, by operation and verdict",
    ["operation", "allowed"],
)
JOBS_BY_PHASE = prometheus_client.Gauge(
    "plrl_operator_jobs", "PipelineRLJobs this operator sees, by phase", ["phase"]
)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Start the /metrics HTTP server in a daemon thread."""
    prometheus_client.start_http_server(port, addr=addr)
