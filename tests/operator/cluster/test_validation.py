"""Invalid jobs are refused by the API server at `kubectl apply` time, naming the field.

Each case is one bad spec (CEL cross-field rules, enums, bounds, patterns, unknown fields, the
name length); the server's message must name the field and say what is wrong, no object may be
left behind, and `plrl run`'s validation (spec.parse_job) refuses the same job.
"""

from __future__ import annotations

from typing import Any

import pytest

from plrl_api import spec
from tests.infra import tools
from tests.operator.cluster import support

pytestmark = pytest.mark.cluster

CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # (case, spec overrides on support.small_job, field named, words of the reason)
    (
        "gen-ge-n",
        {"pipeline": {"generators": 4}},
        "spec.pipeline.generators",
        "must be less than resources.totalGPUs",
    ),
    (
        "gen-tiling",
        {"resources": {"totalGPUs": 8, "gpusPerGenerator": 2}, "pipeline": {"generators": 3}},
        "spec.pipeline.generators",
        "multiple of resources.gpusPerGenerator",
    ),
    (
        "train-tiling",
        {"resources": {"totalGPUs": 5}, "pipeline": {"generators": 2}},
        "spec.resources.gpusPerTrainer",
        "must be a multiple of resources.gpusPerTrainer",
    ),
    (
        "too-small",
        {"resources": {"totalGPUs": 3, "gpusPerGenerator": 2}, "pipeline": {}},
        "spec.resources.totalGPUs",
        "must fit at least one generator and one trainer",
    ),
    (
        "batch-groups",
        {"training": {"batchSize": 60}, "generation": {"samplesPerPrompt": 8}},
        "spec.training.batchSize",
        "multiple of generation.samplesPerPrompt",
    ),
    (
        "micro-batch",
        {"training": {"tokensPerMicroBatch": 128}},
        "spec.training.tokensPerMicroBatch",
        "at least generation.maxNewTokens",
    ),
    (
        "autoscale-max",
        {"pipeline": {"generators": 2, "autoscale": {"maxGenerators": 4}}},
        "spec.pipeline.autoscale.maxGenerators",
        "must be less than resources.totalGPUs",
    ),
    (
        "autoscale-ratios",
        {"pipeline": {"generators": 2, "autoscale": {"lowerRatio": 0.95, "upperRatio": 0.9}}},
        "spec.pipeline.autoscale",
        "lowerRatio must be less than autoscale.upperRatio",
    ),
    (
        "heartbeat",
        {"heartbeat": {"intervalSeconds": 10, "timeoutSeconds": 5}},
        "spec.heartbeat",
        "timeoutSeconds must be greater than heartbeat.intervalSeconds",
    ),
    (
        "hybrid",
        {"pipeline": {"generators": 2, "mode": "hybrid"}},
        "spec.pipeline",
        "hybridSwitchStep is required",
    ),
    ("jsonl", {"task": {"name": "jsonl"}}, "spec.task", "task.dataset is required"),
    (
        "dataset-both",
        {"task": {"name": "jsonl", "dataset": {"path": "/d.jsonl", "configMap": {"name": "p", "key": "k"}}}},
        "spec.task.dataset",
        "exactly one of dataset.path or dataset.configMap",
    ),
    ("engine", {"generation": {"engine": "sglang"}}, "spec.generation.engine", "Unsupported value"),
    ("one-gpu", {"resources": {"totalGPUs": 1}}, "spec.resources.totalGPUs", "greater than or equal to 2"),
    ("temperature", {"generation": {"temperature": 0}}, "spec.generation.temperature", "greater than 0"),
    ("zero-stage", {"training": {"zeroStage": 3}}, "spec.training.zeroStage", "Unsupported value"),
    (
        "resource-name",
        {"resources": {"gpuResourceName": "NVIDIA GPU"}},
        "spec.resources.gpuResourceName",
        "should match",
    ),
    ("typo", {"training": {"batchSiz": 64}}, 'unknown field "spec.training.batchSiz"', ""),
]


@pytest.mark.parametrize(("case", "overrides", "field", "reason"), CASES, ids=[c[0] for c in CASES])
def test_invalid_job_is_refused_naming_the_field(
    chart: support.Chart,
    kubectl: tools.Tool,
    namespace: str,
    case: str,
    overrides: dict[str, Any],
    field: str,
    reason: str,
) -> None:
    doc = support.small_job(f"bad-{case}", **overrides)
    out = kubectl("apply", "-n", namespace, "-f", "-", input=support.dump(doc), check=False)
    assert out.returncode != 0, f"accepted: {out.stdout}"
    assert field in out.stderr and reason in out.stderr, out.stderr
    assert "NotFound" in kubectl("get", "plrljob", f"bad-{case}", "-n", namespace, check=False).stderr
    with pytest.raises(spec.JobFileError):
        spec.parse_job(doc)


def test_name_longer_than_children_allow_is_refused(
    chart: support.Chart, kubectl: tools.Tool, namespace: str
) -> None:
    doc = support.small_job("x" * 41)
    out = kubectl("apply", "-n", namespace, "-f", "-", input=support.dump(doc), check=False)
    assert out.returncode != 0 and "metadata.name" in out.stderr and "40" in out.stderr, out.stderr
    with pytest.raises(spec.JobFileError, match=r"metadata\.name"):
        spec.parse_job(doc)


def test_the_valid_base_job_is_accepted(chart: support.Chart, kubectl: tools.Tool, namespace: str) -> None:
    """The cases above differ from an accepted job only by their one fault."""
    out = kubectl(
        "apply", "-n", namespace, "--dry-run=server", "-f", "-", input=support.dump(support.small_job("ok"))
    )
    assert "created (server dry run)" in out.stdout
