"""The operator's own settings: one frozen dataclass, read from the environment (the chart sets it).

`handlers.py` applies them to kopf at startup; `__main__.py` lets command-line flags override
them. Each field's docstring gives its unit and why the default is what it is.
"""

from __future__ import annotations

import dataclasses
import os


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
    )
