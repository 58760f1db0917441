"""Helpers for the operator tests: the operator as a child process, a small valid job, polling.

`Operator` runs `python -m plrl_operator` with a kubeconfig holding only a TokenRequest token of the
chart's ServiceAccount, the Deployment's flags, free ports for /metrics and /healthz and a 1 s status
interval; `.restart()`, `.metrics()`, `.total()` and `.writes()` serve the tests.
Neighbours: tests/operator/cluster/conftest.py (fixtures), tests/infra (control plane, tokens, tools).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from prometheus_client import parser

from tests.infra import procs, tools

ROOT = pathlib.Path(__file__).resolve().parents[3]
CHART = ROOT / "helm" / "pipelinerl-operator"
RELEASE, RELEASE_NS = "plrl", "plrl-system"
SA_NAME = "plrl-pipelinerl-operator"  # the chart's fullname for release "plrl"
PEERING = "pipelinerl-operator"


def eventually(check: Callable[[], Any], timeout_s: float = 60.0, what: str = "condition") -> Any:
    """Polls check() until it returns something truthy; fails naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


@dataclasses.dataclass
class Chart:
    helm: tools.Tool
    namespace: str
    service_account: str


def _free_port() -> int:
    return procs.free_port()


class Operator:
    """`python -m plrl_operator` as a child process, authenticated as the chart's ServiceAccount."""

    def __init__(
        self, kubeconfig: pathlib.Path, log_dir: pathlib.Path, *args: str, name: str = "operator"
    ) -> None:
        self.kubeconfig = kubeconfig
        self.args = args
        self.name = name
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = self.liveness_port = 0
        self.starts = 0

    def start(self) -> None:
        self.stop()  # never leave a previous process behind
        self.metrics_port, self.liveness_port = _free_port(), _free_port()
        self.starts += 1
        self.log = self.log_dir / f"{self.name}-{self.starts}.log"
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1")
        with self.log.open("wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "plrl_operator",
                    "--all-namespaces",
                    f"--peering={PEERING}",
                    f"--metrics-port={self.metrics_port}",
                    f"--liveness-port={self.liveness_port}",
                    "--status-interval=1",
                    f"--worker-cluster-role={SA_NAME}-worker",  # as the chart's Deployment says
                    *self.args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
            )
        eventually(self._healthy, 60, f"the operator's /healthz (log: {self.log})")

    def _healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            pytest.fail(f"operator exited:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics by (name, sorted labels)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for family in parser.text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def total(self, name: str, **labels: str) -> float:
        return sum(
            v
            for (n, ls), v in self.metrics().items()
            if n == name and all(dict(ls).get(k) == want for k, want in labels.items())
        )

    def writes_to(self, namespace: str, since_start: int | None = None) -> list[str]:
        """Every write this process logged (plrl_operator.k8s: one line per write) into `namespace`;
        with `since_start=k`, those of every process from the k-th start on (`starts` counts them)."""
        first = self.starts if since_start is None else since_start
        logs = [self.log_dir / f"{self.name}-{k}.log" for k in range(first, self.starts + 1)]
        return [
            line
            for log in logs
            for line in log.read_text(errors="replace").splitlines()
            if "write: " in line and f"/namespaces/{namespace}/" in line
        ]

    def writes(self) -> float:
        """API requests this process made that could change something (anything but GET)."""
        return sum(
            v
            for (n, ls), v in self.metrics().items()
            if n == "plrl_operator_api_requests_total" and dict(ls).get("verb") != "GET"
        )


def small_job(name: str, **spec: Any) -> dict[str, Any]:
    """A valid job with N=4 (2 generator pods of 1 GPU, 1 trainer pod of 2 GPUs) on the fake nodes."""
    base: dict[str, Any] = {
        "model": {"name": "/models/tiny"},
        "resources": {
            "totalGPUs": 4,
            "gpusPerGenerator": 1,
            "gpusPerTrainer": 2,
            "cpu": "1",
            "memory": "1Gi",
            "image": "ghcr.io/pipelinerl/plrl-worker:0.1.0",
        },
        "pipeline": {"generators": 2},
        "generation": {"maxNewTokens": 256},
        "training": {"batchSize": 64},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": "pipelinerl.io/v1alpha1",
        "kind": "PipelineRLJob",
        "metadata": {"name": name},
        "spec": base,
    }


def dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)
