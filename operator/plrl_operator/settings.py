"""The operator's own settings: one frozen dataclass, read from the environment (the chart sets it).

`handlers.py` applies them to kopf at startup; `__main__.py` lets command-line flags override
them. Each field's docstring gives its unit and why the default is what it is.
"""

from __future__ import annotations

import dataclasses
import os

from plrl_api import names


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty means cluster-wide (the chart's `watch.namespaces`)."""

    peering: str | None = None
    """kopf peering object name, so several replicas elect one active; None runs standalone."""

    priority: int = 0
    """kopf peering priority: among live replicas the highest one works, the others pause. Equal
    priorities make kopf pause every replica, so `__main__` picks a random one unless told."""

    metrics_port: int = 9090
    """Port of the Prometheus `/metrics` endpoint (0 disables it, e.g. in tests run in-process)."""

    liveness_port: int = 8080
    """Port of kopf's `/healthz` liveness endpoint (0 disables it)."""

    status_interval: float = 5.0
    """Seconds between status refreshes of a job (from in-memory indexes: no API reads)."""

    field_manager: str = "pipelinerl-operator"
    """Server-side apply field manager: the name `kubectl get -o yaml --show-managed-fields` shows."""

    webhook_port: int = 0
    """Port of the validating admission webhook (HTTPS; the chart uses 9443); 0 serves none."""

    webhook_addr: str = "0.0.0.0"
    """Address the webhook listens on (127.0.0.1 for an operator outside the cluster)."""

    webhook_cert_dir: str | None = None
    """Directory holding the webhook's `tls.crt`, `tls.key` and `ca.crt` (the chart mounts its
    Secret here; files are re-read when they change). Unset: the operator writes a fresh CA and
    a certificate for `webhook_host` at startup (`certs.write`)."""

    webhook_host: str | None = None
    """Set for an operator outside the cluster (tests, development): it then manages its own
    ValidatingWebhookConfiguration (`webhook_configuration`) with the URL https://<host>:<port>,
    which needs create/patch on validatingwebhookconfigurations. Unset (the chart): the chart's
    ValidatingWebhookConfiguration points the API server at the operator's Service."""

    worker_cluster_role: str = names.WORKER_CLUSTER_ROLE
    """The ClusterRole each job's RoleBinding grants its worker pods (the chart's `<release>-worker`:
    Leases only). The operator may bind it, and no other role."""

    @property
    def webhook_configuration(self) -> str:
        """Name of the ValidatingWebhookConfiguration the operator manages when `webhook_host` is set."""
        return f"{self.field_manager}.pipelinerl.io"

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces


def _split(value: str) -> tuple[str, ...]:
    return tuple(ns.strip() for ns in value.split(",") if ns.strip())


def from_env(env: dict[str, str] | None = None) -> OperatorConfig:
    """Settings from `PLRL_*` variables; unset ones keep the defaults above."""
    e = os.environ if env is None else env
    d = OperatorConfig()
    return OperatorConfig(
        namespaces=_split(e.get("PLRL_NAMESPACES", "")),
        peering=e.get("PLRL_PEERING") or None,
        priority=int(e.get("PLRL_PRIORITY", d.priority)),
        metrics_port=int(e.get("PLRL_METRICS_PORT", d.metrics_port)),
        liveness_port=int(e.get("PLRL_LIVENESS_PORT", d.liveness_port)),
        status_interval=float(e.get("PLRL_STATUS_INTERVAL", d.status_interval)),
        field_manager=e.get("PLRL_FIELD_MANAGER", d.field_manager),
        webhook_port=int(e.get("PLRL_WEBHOOK_PORT", d.webhook_port)),
        webhook_addr=e.get("PLRL_WEBHOOK_ADDR", d.webhook_addr),
        webhook_cert_dir=e.get("PLRL_WEBHOOK_CERT_DIR") or None,
        webhook_host=e.get("PLRL_WEBHOOK_HOST") or None,
        worker_cluster_role=e.get("PLRL_WORKER_CLUSTER_ROLE", d.worker_cluster_role),
    )


def check(config: OperatorConfig) -> str | None:
    """What is wrong with a combination of settings (None: nothing)."""
    if config.webhook_port and not (config.webhook_cert_dir or config.webhook_host):
        return (
            "the webhook needs a certificate: --webhook-cert-dir (the chart's Secret), or "
            "--webhook-host to have the operator generate one and register the webhook itself"
        )
    if (config.webhook_cert_dir or config.webhook_host) and not config.webhook_port:
        return "--webhook-cert-dir and --webhook-host need --webhook-port"
    return None
