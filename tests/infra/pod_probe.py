"""Container probes (startup, readiness, liveness) as a kubelet runs them.

`Prober` holds one probe's schedule and thresholds (pure: it is given the clock and each attempt's
result, and says when the next attempt is due and whether the probe passes). `attempt` does one check:
`httpGet` and `tcpSocket` from the host to the pod's address over the pod network, `exec` inside the
container's namespaces and root (nsenter), each within `timeoutSeconds`. gRPC probes are not supported
(reported as failing, with the reason in the log).

Neighbours: pod_runner.py (drives the probers of each running container, reports `ready` and restarts
on a failed liveness probe).
"""

from __future__ import annotations

import dataclasses
import http.client
import logging
import socket
import subprocess
from typing import Any

log = logging.getLogger("node-agent.probe")


@dataclasses.dataclass
class Prober:
    """One probe of one container run (a restart gets a fresh one)."""

    spec: dict[str, Any]
    started_at: float
    passing: bool = False
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0

    def __post_init__(self) -> None:
        self.next_at = self.started_at + float(self.spec.get("initialDelaySeconds", 0))

    @property
    def period_s(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    @property
    def timeout_s(self) -> float:
        return float(self.spec.get("timeoutSeconds", 1))

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, ok: bool, now: float) -> bool:
        """Count one attempt; True when `passing` changed. Success/failure thresholds as in the API."""
        self.next_at = now + self.period_s
        before = self.passing
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.passing = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= int(self.spec.get("failureThreshold", 3)):
                self.passing = False
        return self.passing != before

    @property
    def failed(self) -> bool:
        """failureThreshold consecutive failures: a liveness (or startup) probe's restart signal."""
        return self.failures >= int(self.spec.get("failureThreshold", 3))


def _port(port: Any, container: dict[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"no container port named {port!r}")


def attempt(spec: dict[str, Any], container: dict[str, Any], pod_ip: str, pid: int | None) -> bool:
    """One check of the probe `spec`; False on any failure (logged at debug)."""
    timeout = float(spec.get("timeoutSeconds", 1))
    try:
        if "httpGet" in spec:
            h = spec["httpGet"]
            conn_cls = (
                http.client.HTTPSConnection
                if h.get("scheme", "HTTP") == "HTTPS"
                else http.client.HTTPConnection
            )
            conn = conn_cls(h.get("host") or pod_ip, _port(h["port"], container), timeout=timeout)
            try:
                headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or []}
                conn.request("GET", h.get("path", "/"), headers={"User-Agent": "kube-probe/1.37", **headers})
                return 200 <= conn.getresponse().status < 400
            finally:
                conn.close()
        if "tcpSocket" in spec:
            t = spec["tcpSocket"]
            with socket.create_connection((t.get("host") or pod_ip, _port(t["port"], container)), timeout):
                return True
        if "exec" in spec:
            if pid is None:
                return False
            argv = ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--"]
            proc = subprocess.run(
                [*argv, *spec["exec"]["command"]], capture_output=True, timeout=timeout, check=False
            )
            return proc.returncode == 0
        log.warning("unsupported probe %s: counted as failing", sorted(spec))
        return False
    except (OSError, ValueError, http.client.HTTPException, subprocess.TimeoutExpired) as err:
        log.debug("probe failed: %s", err)
        return False
