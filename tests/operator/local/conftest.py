"""Helpers for tests that run whole jobs with `plrl run` (real processes, gloo, gRPC, torch); every run
is a `tests.infra.procs` process tree, so no worker outlives its test."""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

import pytest
import yaml

from tests.infra import procs

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


def plrl_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "plrl_operator.cli", *args]


def plrl_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def plrl(*args: str, timeout: float = 600) -> procs.Completed:
    """`plrl <args>` as a process tree: after a timeout or a failure no worker it started is left
    running, and `leftover` names the processes it left behind when it exited (killed since)."""
    return procs.run_tree(plrl_argv(*args), timeout=timeout, env=plrl_env())


@pytest.fixture
def run_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "run"
