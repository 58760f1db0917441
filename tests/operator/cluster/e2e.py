"""Support for the end-to-end tests: the demo job (examples/cluster-tiny.yaml) `kubectl apply`-ed onto
fake GPU nodes whose pods really run (the node agent's process runner), watched through `kubectl get
plrljobs`, and read back from its checkpoint volume (trainer rank 0's step records are kept there).

- `Tiny`: one such job in a test's namespace: `apply()`, `row()` (its `kubectl get plrljobs` line by
  column), `watch(until)` (every row seen on the way), `records()`, `pods()`, `log_tails()`.
- `table(text)`: a kubectl table by column, empty cells included.
- `plrl_run(job_file, run_dir)`: the same job through `plrl run`, its process tree killed on timeout.

Fixtures (tests/operator/cluster/conftest.py): `demo_models` (session: the tiny model, prepared once)
and `tiny` (a factory of `Tiny` jobs on a fresh process-runner node, with the example's two claims;
on failure it prints every worker's log tail, the job's `kubectl describe` and its pods).
Neighbours: tests/infra/demo.py (model, claims, the example), tests/operator/cluster/support.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest
import yaml

from plrl_api import names, records
from plrl_operator.local import report
from tests.infra import demo, tools

TERMINAL = ("Succeeded", "Failed")


def table(text: str) -> list[dict[str, str]]:
    """Rows of a kubectl table as {column: cell}; cells are cut at the header's column offsets, so
    empty cells read as "" (kubectl pads every column to its widest cell)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    names = header.split()
    out = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        out.append(dict(zip(names, cells, strict=True)))
    return out


@dataclasses.dataclass
class Seen:
    at_s: float
    """Seconds since `apply()`."""
    row: dict[str, str]


@dataclasses.dataclass
class Tiny:
    kubectl: tools.Tool
    namespace: str
    doc: dict[str, Any]
    job_file: pathlib.Path
    checkpoints: pathlib.Path
    node_state: pathlib.Path | None
    applied_at: float = 0.0

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])

    def apply(self) -> str:
        self.job_file.write_text(yaml.safe_dump(self.doc, sort_keys=False))
        self.applied_at = time.monotonic()
        return self.kubectl("apply", "-n", self.namespace, "-f", str(self.job_file)).stdout.strip()

    def patch(self, spec: dict[str, Any]) -> None:
        self.kubectl(
            "patch",
            "plrljob",
            self.name,
            "-n",
            self.namespace,
            "--type=merge",
            "-p",
            json.dumps({"spec": spec}),
        )

    def row(self) -> dict[str, str]:
        out = self.kubectl("get", "plrljobs", self.name, "-n", self.namespace, check=False)
        rows = table(out.stdout) if out.returncode == 0 else []
        return rows[0] if rows else {}

    def status(self) -> dict[str, Any]:
        out = self.kubectl("get", "plrljob", self.name, "-n", self.namespace, "-o", "json", check=False)
        return dict(json.loads(out.stdout).get("status", {})) if out.returncode == 0 else {}

    def watch(self, until: str, timeout_s: float = 300, stop_at_step: int | None = None) -> list[Seen]:
        """`kubectl get plrljobs` every half second until PHASE is `until` (or STEP reaches
        `stop_at_step`); fails early if the job ends in another terminal phase."""
        seen: list[Seen] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            row = self.row()
            if row:
                seen.append(Seen(time.monotonic() - self.applied_at, row))
                phase, step = row.get("PHASE", ""), row.get("STEP", "")
                if phase == until or (
                    stop_at_step is not None and step.isdigit() and int(step) >= stop_at_step
                ):
                    return seen
                if phase in TERMINAL:
                    pytest.fail(
                        f"{self.name} ended {phase}, expected {until}: {self.status().get('conditions')}"
                    )
            time.sleep(0.5)
        pytest.fail(
            f"{self.name}: not {until} after {timeout_s:.0f} s; last row {seen[-1].row if seen else None}"
        )

    def records(self) -> list[records.StepRecord]:
        """The job's step records as `plrl status` reads them (a re-trained step's latest wins)."""
        return report.read_records(self.checkpoints)

    def metrics_lines(self) -> int:
        f = self.checkpoints / records.METRICS_FILE
        return len(f.read_text().splitlines()) if f.exists() else 0

    def pods(self) -> list[dict[str, Any]]:
        out = self.kubectl(
            "get", "pods", "-n", self.namespace, "-l", f"pipelinerl.io/job={self.name}", "-o", "json"
        )
        return list(json.loads(out.stdout)["items"])

    def uids(self, role: str) -> dict[str, str]:
        """The uid of each of its pods of `role`, by pod name (a replaced pod has a new one)."""
        return {
            str(p["metadata"]["name"]): str(p["metadata"]["uid"])
            for p in self.pods()
            if p["metadata"]["labels"][names.LABEL_ROLE] == role
        }

    def events(self, reason: str) -> list[str]:
        """The messages of this namespace's Events with `reason`."""
        out = self.kubectl(
            "get", "events", "-n", self.namespace, "--field-selector", f"reason={reason}", "-o", "json"
        )
        return [str(ev["message"]) for ev in json.loads(out.stdout)["items"]]

    def container_log(self, pod: str) -> str:
        """Every run of every container of `pod` (by name, across its uids), oldest first."""
        if self.node_state is None:
            pytest.fail("a reused cluster: no node agent logs here")
        files = sorted(
            (self.node_state / "logs").glob(f"{self.namespace}_{pod}_*/*/*.log"),
            key=lambda f: (f.stat().st_mtime, f.name),
        )
        return "\n".join(f.read_text(errors="replace") for f in files)

    def log_tails(self, lines: int = 25) -> str:
        """The last lines of every container log of this namespace's pods (the node agent's files)."""
        if self.node_state is None:
            return "(a reused cluster: no node agent logs here)"
        parts = []
        for f in sorted((self.node_state / "logs").glob(f"{self.namespace}_*/*/*.log")):
            text = f.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {f.relative_to(self.node_state)} ---\n" + "\n".join(text))
        return "\n".join(parts) or "(no container logs)"


def plrl_run(
    job_file: pathlib.Path, run_dir: pathlib.Path, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """`plrl run job_file --run-dir run_dir --quiet`; on timeout its whole process tree is killed
    (its workers run in sessions of their own, out of reach of a process-group kill)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "plrl_operator.cli",
            "run",
            str(job_file),
            "--run-dir",
            str(run_dir),
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        tree = psutil.Process(proc.pid).children(recursive=True)
        for p in [psutil.Process(proc.pid), *tree]:
            p.kill()
        out, err = proc.communicate()
        pytest.fail(f"plrl run did not finish in {timeout_s:.0f} s:\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def job_file_for_plrl_run(doc: dict[str, Any], model_dir: pathlib.Path, path: pathlib.Path) -> pathlib.Path:
    """The same job for `plrl run`: only where the model lives differs (a host path, not the pods')."""
    local = demo.merge(doc, {"spec": {"model": {"name": str(model_dir)}}})
    path.write_text(yaml.safe_dump(local, sort_keys=False))
    return path
