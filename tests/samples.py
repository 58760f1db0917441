"""Sample objects for tests: one place that knows how to make a valid `StepRecord` or job."""

from __future__ import annotations

import atexit
import functools
import pathlib
import shutil
import tempfile
from typing import Any

from plrl_api import identity, names, records, spec

TOKEN = "t"


@functools.cache
def token_env() -> dict[str, str]:
    """The environment entry that gives a worker the token `TOKEN` (a file, as a pod's mounted
    Secret; removed when the test process exits)."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="plrl-token-"))
    atexit.register(shutil.rmtree, tmp, True)
    return {names.ENV_TOKEN_FILE: str(identity.write_token(tmp / names.TOKEN_KEY, TOKEN))}


def job(job_spec: dict[str, Any], **metadata: Any) -> spec.PipelineRLJob:
    """A `PipelineRLJob` with `job_spec` as its spec; metadata defaults to name demo in namespace ns
    (`metadata` overrides or adds fields: name, namespace, uid, generation)."""
    meta = {"name": "demo", "namespace": "ns", "uid": "u", "generation": 1} | metadata
    doc = {
        "apiVersion": "pipelinerl.io/v1alpha1",
        "kind": "PipelineRLJob",
        "metadata": meta,
        "spec": job_spec,
    }
    return spec.parse_job(doc)


def step_record(**overrides: Any) -> records.StepRecord:
    """A plausible step-12 record (what `trainer.Coordination.log_step` writes), with `overrides`."""
    base: dict[str, Any] = {
        "step": 12,
        "version": 12,
        "elapsed_s": 60.0,
        "step_s": 4.0,
        "busy_s": 3.0,
        "reward_mean": 0.375,
        "lag_mean": 1.25,
        "lag_max": 3,
        "mixed_version_samples": 5,
        "completion_tokens": 900,
        "generated_tokens_per_s": 800.0,
        "trained_tokens_per_s": 1000.0,
        "train_busy_tokens_per_s": 1333.0,
        "input_tokens": 4000.0,
        "loss": 0.1,
        "ess": 0.9,
        "prompts": records.PromptCounts(issued=40, trained=36, buffered=4),
    }
    return records.StepRecord.model_validate(base | overrides)
