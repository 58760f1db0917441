"""The job spec: defaults users rely on, and errors that name the field."""

from __future__ import annotations

import pathlib

import pytest

from plrl_api import spec
from plrl_operator import jobfile


def _job(**spec_overrides: object) -> dict[str, object]:
    return {
        "apiVersion": "pipelinerl.io/v1alpha1",
        "kind": "PipelineRLJob",
        "metadata": {"name": "demo"},
        "spec": spec_overrides,
    }


def test_defaults_are_the_seed_values() -> None:
    job = spec.parse_job(_job())
    a = job.spec.pipeline.autoscale
    assert (a.every_steps, a.lower_ratio, a.upper_ratio, a.step_down, a.step_up) == (10, 0.9, 0.95, 5, 2)
    assert job.spec.training.loss.is_clamp == 5.0
    assert job.spec.resources.gpu_resource_name == "nvidia.com/gpu"


def test_camel_case_round_trip() -> None:
    doc = _job(resources={"totalGPUs": 16, "gpusPerGenerator": 2}, pipeline={"generators": 4})
    job = spec.parse_job(doc)
    assert job.spec.resources.total_gpus == 16
    dumped = spec.dump_job(job)
    assert dumped["spec"]["resources"]["totalGPUs"] == 16
    assert spec.parse_job(dumped) == job


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        (
            {"pipeline": {"generators": 8}, "resources": {"totalGPUs": 8}},
            "spec",
            "less than resources.totalGPUs",
        ),
        ({"training": {"batchSize": 100}, "generation": {"samplesPerPrompt": 8}}, "spec", "multiple of"),
        ({"training": {"batchSiz": 100}}, "spec.training.batchSiz", "unknown field"),
        ({"generation": {"engine": "sglang"}}, "spec.generation.engine", "'vllm' or 'torch'"),
        ({"pipeline": {"mode": "hybrid"}}, "spec.pipeline", "hybridSwitchStep is required"),
        ({"heartbeat": {"intervalSeconds": 10, "timeoutSeconds": 5}}, "spec.heartbeat", "greater than"),
        ({"resources": {"totalGPUs": 1}}, "spec.resources.totalGPUs", "greater than or equal to 2"),
    ],
)
def test_bad_specs_name_the_field(overrides: dict[str, object], field: str, reason: str) -> None:
    with pytest.raises(spec.JobFileError) as exc:
        spec.parse_job(_job(**overrides))
    line = str(exc.value)
    assert line.startswith(field + ":"), line
    assert reason in line


def test_load_job_names_the_file(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "job.yaml"
    p.write_text("apiVersion: pipelinerl.io/v1alpha1\nkind: PipelineRLJob\nmetadata: {name: Bad_Name}\n")
    with pytest.raises(
        spec.JobFileError, match=r"job.yaml: invalid PipelineRLJob:\nmetadata.name: .*DNS label"
    ):
        jobfile.load_job(p)


_ROOT = pathlib.Path(__file__).parents[2]
SHIPPED_JOBS = sorted([*(_ROOT / "examples").glob("*.yaml"), *(_ROOT / "bench" / "jobs").glob("*.yaml")])


@pytest.mark.parametrize("path", SHIPPED_JOBS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_job_file_is_a_valid_job(path: pathlib.Path) -> None:
    job = jobfile.load_job(path)
    assert job.metadata.name
    assert len(SHIPPED_JOBS) >= 4  # examples/job.yaml, local-tiny.yaml and the bench jobs are found
