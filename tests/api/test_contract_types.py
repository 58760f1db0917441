"""The API's contract types: pod plan, worker config, identity, step records, Lease reports.

Cases: `PodPlan.of` sizes pods per role, gives conventional mode no generators, and refuses an I
that does not tile, naming the fields; a `WorkerConfig` survives dump -> load unchanged, refuses a
field nobody reads (naming it and the file), and leaves `suspend` out; `Identity.from_env`
needs the token, refuses a non-numeric index naming the variable, and ranks trainer processes
pod-major; a `StepRecord` line with NaN reads back as null/None, a half-written last line is
skipped, and a JSON line that is not a record raises; `PromptCounts.balanced`; a worker report
survives its Lease encoding, bad annotation values read as absent, and a Lease that is not a
worker's reads as None.
"""

from __future__ import annotations

import math
import pathlib

import pydantic
import pytest

from plrl_api import identity, names, plan, records, spec, worker_config
from tests import samples


def _job(**spec_fields: object) -> spec.PipelineRLJob:
    return spec.parse_job(
        {
            "apiVersion": "pipelinerl.io/v1alpha1",
            "kind": "PipelineRLJob",
            "metadata": {"name": "demo"},
            "spec": {
                "model": {"name": "/models/demo"},
                "resources": {"totalGPUs": 8, "gpusPerTrainer": 2},
                **spec_fields,
            },
        }
    )


def test_pod_plan() -> None:
    p = plan.PodPlan.of(_job().spec, 2)
    assert (p.generator_pods, p.trainer_pods, p.trainer_gpus) == (2, 3, 6)
    assert (p.pods("generator"), p.gpus_per_pod("trainer")) == (2, 2)
    conventional = plan.PodPlan.of(_job(pipeline={"mode": "conventional"}).spec, 2)
    assert (conventional.generator_pods, conventional.trainer_gpus) == (0, 8)
    with pytest.raises(plan.PlanError, match=r"resources\.gpusPerTrainer=2"):
        plan.PodPlan.of(_job().spec, 3)  # leaves 5 trainer GPUs for 2-GPU pods
    with pytest.raises(plan.PlanError, match=r"resources\.totalGPUs - 1 = 7"):
        plan.PodPlan.of(_job().spec, 8)


def _config(job: spec.PipelineRLJob | None = None) -> worker_config.WorkerConfig:
    job = job or _job()
    return worker_config.build(
        job,
        plan.PodPlan.of(job.spec, 2),
        names.TRAINER,
        worker_config.Endpoints(
            coordinator="t0:50051", rendezvous="t0:29500", weight_sync="t0:29600", metrics_port=9400
        ),
        worker_config.Paths(model_dir="/m", checkpoint_dir="/c"),
    )


def test_worker_config_round_trip_and_unknown_fields(tmp_path: pathlib.Path) -> None:
    cfg = _config()
    path = tmp_path / "trainer.json"
    path.write_text(worker_config.dump(cfg))
    assert worker_config.load(path) == cfg
    doc = path.read_text().replace('"metricsPort": 9400', '"metricsPort": 9400, "generatorService": "x"')
    path.write_text(doc)
    with pytest.raises(
        worker_config.ConfigError, match=r"(?s)trainer\.json.*endpoints\.generatorService: unknown field"
    ):
        worker_config.load(path)
    with pytest.raises(pydantic.ValidationError, match="expected host:port"):
        worker_config.Endpoints(coordinator="t0", rendezvous="t0:1", weight_sync="t0:2", metrics_port=1)


def test_suspend_is_not_part_of_the_worker_config() -> None:
    running, suspended = _config(_job(suspend=False)), _config(_job(suspend=True))
    assert worker_config.dump(running) == worker_config.dump(suspended)
    assert '"suspend"' not in worker_config.dump(running)


def test_identity_from_env(tmp_path: pathlib.Path) -> None:
    with pytest.raises(identity.IdentityError, match=f"{names.ENV_TOKEN_FILE} is not set"):
        identity.Identity.from_env({})
    missing = tmp_path / "nope"
    with pytest.raises(identity.IdentityError, match=f"{names.ENV_TOKEN_FILE}={missing}: cannot read"):
        identity.Identity.from_env({names.ENV_TOKEN_FILE: str(missing)})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(identity.IdentityError, match="is empty; refusing to start unauthenticated"):
        identity.Identity.from_env({names.ENV_TOKEN_FILE: str(tmp_path / "empty")})
    token = samples.token_env()
    with pytest.raises(identity.IdentityError, match=f"{names.ENV_POD_INDEX}='x' must be an integer"):
        identity.Identity.from_env(token | {names.ENV_POD_INDEX: "x"})
    pod = identity.Identity.from_env(token | {names.ENV_POD_INDEX: "3"})
    assert (pod.pod_index, pod.local_rank, pod.pod_name, pod.bind_host) == (3, None, None, "0.0.0.0")
    assert pod.token == samples.TOKEN
    rank = identity.Identity.from_env(token | {names.ENV_POD_INDEX: "3", names.ENV_LOCAL_RANK: "1"})
    assert rank.rank(gpus_per_pod=4) == 13


def test_plrl_run_writes_the_token_for_its_user_only(tmp_path: pathlib.Path) -> None:
    path = identity.write_token(tmp_path / "secret" / "token", "s3cret")
    assert identity.read_token(str(path)) == "s3cret"
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)


def test_step_records_read_back() -> None:
    line = samples.step_record(reward_mean=math.nan, details={"kl": math.inf}).to_json()
    assert "NaN" not in line and "Infinity" not in line
    text = (
        line + "\n" + samples.step_record(step=13).to_json() + "\n" + '{"step": 3, "vers'
    )  # a line being written
    rows = records.read_step_records(text)
    assert [r.step for r in rows] == [12, 13]
    assert rows[0].reward_mean is None and rows[0].details == {"kl": None}
    assert rows[0].prompts.balanced and rows[0].prompts.outstanding == 4
    with pytest.raises(pydantic.ValidationError, match="reward_mean"):
        records.read_step_records('{"step": 1, "version": 1}')  # a writer/reader mismatch is loud


def test_worker_reports_survive_their_lease_encoding() -> None:
    report = records.WorkerReport(
        role="trainer",
        weight_version=7,
        tokens_per_second=12.5,
        queue_depth=3,
        utilisation=0.25,
        progress=records.progress(samples.step_record(step=7, version=7), finished=True),
    )
    assert records.parse_annotations(records.lease_annotations(report)) == report
    garbled = records.lease_annotations(report) | {
        names.ANNOTATION_PROGRESS: "{",
        names.ANNOTATION_QUEUE_DEPTH: "x",
    }
    back = records.parse_annotations(garbled)
    assert back is not None and back.progress is None and back.queue_depth is None
    assert records.parse_annotations({"other": "lease"}) is None
