"""Helpers for tests that run whole jobs with `plrl run` (real processes, gloo, gRPC, torch)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

import psutil
import pytest
import yaml

SMALL_JOB: dict[str, Any] = {
    "apiVersion": "pipelinerl.io/v1alpha1",
    "kind": "PipelineRLJob",
    "metadata": {"name": "small"},
    "spec": {
        "model": {"name": "builtin:tiny", "dtype": "float32", "warmStartSteps": 30},
        "task": {"name": "builtin:arith"},
        "resources": {"totalGPUs": 2},
        "generation": {
            "engine": "torch",
            "concurrentSequences": 16,
            "maxNewTokens": 8,
            "samplesPerPrompt": 4,
        },
        "training": {
            "backend": "torch",
            "batchSize": 16,
            "learningRate": 1e-4,
            "tokensPerMicroBatch": 512,
            "totalSteps": 8,
            "checkpoint": {"everySteps": 4},
        },
        "pipeline": {"maxLag": 8},
    },
}


def write_job(path: pathlib.Path, overrides: dict[str, Any] | None = None, **spec: Any) -> pathlib.Path:
    """SMALL_JOB with `spec` groups merged in (one level deep) and top-level `overrides`."""
    doc = yaml.safe_load(yaml.safe_dump(SMALL_JOB))
    for group, values in spec.items():
        doc["spec"].setdefault(group, {}).update(values)
    doc.update(overrides or {})
    path.write_text(yaml.safe_dump(doc))
    return path


def plrl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "plrl_operator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def processes_using(path: pathlib.Path) -> list[str]:
    """Command lines of live processes that mention `path` (orphans of a run)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if str(path) in cmd:
            found.append(cmd)
    return found


@pytest.fixture
def run_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "run"
