"""The worker Lease a heartbeat applies, built without a cluster (plrl_workers.heartbeat's pure half).

Cases: the operator's own reader (`status.progress_from_leases`, `status.compute_status`) gets back
exactly the trainer's metrics row (step, version, lag, reward, tokens/s, ratio) and `finished`;
every other worker's numbers land in string annotations, with None fields left out and non-finite
or out-of-range numbers never written as such; no progress before trainer rank 0 has a row unless
the job is already finished; the Lease's name, labels, holder, duration (ceil of the timeout),
MicroTime stamps and job ownership; the target comes from the operator-rendered worker config
plus the pod's env, and is absent under `plrl run` (no cluster env), where `start` starts nothing.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

import pytest

from plrl_operator import spec, status
from plrl_operator.render import common
from plrl_operator.render import config as render_config
from plrl_workers import config as config_mod
from plrl_workers import heartbeat

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
ROW: dict[str, Any] = {  # the shape trainer.Coordination.log_step writes
    "step": 12,
    "version": 12,
    "elapsed_s": 60.0,
    "step_s": 4.0,
    "busy_s": 3.0,
    "reward_mean": 0.375,
    "lag_mean": 1.25,
    "lag_max": 3,
    "mixed_version_samples": 5,
    "generated_tokens_per_s": 800.0,
    "trained_tokens_per_s": 1000.0,
    "train_busy_tokens_per_s": 1333.0,
    "loss": 0.1,
}


def _job() -> spec.PipelineRLJob:
    return spec.parse_job(
        {
            "apiVersion": "pipelinerl.io/v1alpha1",
            "kind": "PipelineRLJob",
            "metadata": {"name": "demo", "namespace": "ns", "uid": "uid-1", "generation": 1},
            "spec": {
                "resources": {"totalGPUs": 4},
                "pipeline": {"generators": 2},
                "heartbeat": {"intervalSeconds": 2, "timeoutSeconds": 7.5},
            },
        }
    )


def _worker_config(role: str) -> config_mod.WorkerConfig:
    """What the operator mounts at /etc/plrl/<role>.json."""
    job = _job()
    doc = render_config.worker_config(job, common.Plan.of(job.spec, 2), role)
    return config_mod.WorkerConfig.model_validate(doc)


def _target(role: str = "trainer", pod: str = "demo-train-0") -> heartbeat.Target:
    tgt = heartbeat.target(_worker_config(role), {"PLRL_NAMESPACE": "ns", "PLRL_POD_NAME": pod})
    assert tgt is not None
    return tgt


def test_the_operator_reads_back_the_trainers_row() -> None:
    rep = heartbeat.trainer_report(
        ROW, step=12, weight_version=12, finished=False, tokens_per_second=950.0, queue_depth=4
    )
    lease = heartbeat.lease(_target(), rep, now=T0, acquired=T0)
    got = status.progress_from_leases([lease])
    assert got == status.Progress(
        step=12,
        weight_version=12,
        lag=status.Lag(mean=1.25, max=3),
        reward=0.375,
        throughput=status.Throughput(
            generated_tokens_per_second=800.0, trained_tokens_per_second=1000.0, ratio=1.25
        ),
        finished=False,
    )
    ann = lease["metadata"]["annotations"]
    assert {k: v for k, v in ann.items() if k != status.PROGRESS_ANNOTATION} == {
        "pipelinerl.io/role": "trainer",
        "pipelinerl.io/weight-version": "12",
        "pipelinerl.io/tokens-per-second": "950.0",
        "pipelinerl.io/queue-depth": "4",
        "pipelinerl.io/utilisation": "0.750",  # busy 3 s of a 4 s step
    }


def test_finished_reaches_the_job_status() -> None:
    job = _job()
    rep = heartbeat.trainer_report(
        dict(ROW, step=1000, version=1000), step=1000, weight_version=1000, finished=True
    )
    children = status.Children(leases=[heartbeat.lease(_target(), rep, now=T0, acquired=T0)])
    s = status.compute_status(job, 2, children, status.JobStatus(phase="Running"), T0)
    assert s.phase == "Succeeded" and s.step == 1000


def test_no_progress_before_the_first_step_unless_already_finished() -> None:
    early = heartbeat.trainer_report(None, step=0, weight_version=0, finished=False)
    assert status.PROGRESS_ANNOTATION not in heartbeat.lease_annotations(early)
    assert heartbeat.lease_annotations(early) == {
        "pipelinerl.io/role": "trainer",
        "pipelinerl.io/weight-version": "0",
    }
    # A job resumed from its final checkpoint has no new row but must still say it is done.
    done = heartbeat.trainer_report(None, step=50, weight_version=50, finished=True)
    assert done.progress == status.Progress(step=50, weight_version=50, finished=True)


def test_generator_annotations() -> None:
    rep = heartbeat.generator_report(
        weight_version=7, tokens_per_second=1234.56, in_flight=96, capacity=128, queue_depth=2
    )
    assert heartbeat.lease_annotations(rep) == {
        "pipelinerl.io/role": "generator",
        "pipelinerl.io/weight-version": "7",
        "pipelinerl.io/tokens-per-second": "1234.6",
        "pipelinerl.io/queue-depth": "2",
        "pipelinerl.io/utilisation": "0.750",
    }


def test_bad_numbers_are_never_written_as_such() -> None:
    row = dict(ROW, reward_mean=float("nan"), generated_tokens_per_s=0.0, lag_mean=float("inf"))
    prog = heartbeat.progress(row)
    assert prog.reward is None  # a batch without samples: no reward, not NaN
    assert prog.throughput.ratio == 0.0 and prog.lag.mean == 0.0
    json.loads(prog.model_dump_json())  # valid JSON (NaN would not be)
    ann = heartbeat.lease_annotations(
        heartbeat.Report(role="generator", tokens_per_second=float("nan"), utilisation=1.7)
    )
    assert ann == {"pipelinerl.io/role": "generator", "pipelinerl.io/utilisation": "1.000"}
    assert heartbeat.lease_annotations(heartbeat.Report(role="trainer")) == {"pipelinerl.io/role": "trainer"}


def test_lease_shape() -> None:
    now = T0 + datetime.timedelta(seconds=3, microseconds=250)
    lease = heartbeat.lease(
        _target("generator", "demo-gen-1"), heartbeat.Report(role="generator"), now=now, acquired=T0
    )
    assert lease["metadata"]["name"] == "demo-demo-gen-1"  # `<job>-<pod>`
    assert lease["metadata"]["namespace"] == "ns"
    assert lease["metadata"]["labels"] == {"pipelinerl.io/job": "demo", "pipelinerl.io/role": "generator"}
    assert lease["metadata"]["ownerReferences"] == [
        {"apiVersion": "pipelinerl.io/v1alpha1", "kind": "PipelineRLJob", "name": "demo", "uid": "uid-1"}
    ]
    assert lease["spec"] == {
        "holderIdentity": "demo-gen-1",
        "leaseDurationSeconds": 8,  # timeoutSeconds 7.5, rounded up: never shorter than the timeout
        "acquireTime": "2026-01-01T12:00:00.000000Z",
        "renewTime": "2026-01-01T12:00:03.000250Z",
    }


def test_target_from_the_rendered_config_and_the_pods_env() -> None:
    tgt = _target("generator", "demo-gen-0")
    assert (tgt.namespace, tgt.name, tgt.role, tgt.job_uid) == ("ns", "demo-demo-gen-0", "generator", "uid-1")
    assert (tgt.interval_s, tgt.timeout_s) == (2.0, 7.5)
    # The operator labels the Lease the way its watch selects a job's children.
    assert heartbeat.LABEL_JOB == common.LABEL_JOB and heartbeat.LABEL_ROLE == common.LABEL_ROLE


def test_outside_a_cluster_nothing_starts(caplog: pytest.LogCaptureFixture) -> None:
    cfg = _worker_config("trainer")
    assert heartbeat.target(cfg, {}) is None
    assert heartbeat.start(cfg, lambda: heartbeat.Report(role="trainer"), env={}) is None  # plrl run
    # A pod without credentials (e.g. automountServiceAccountToken: false): said once, then trains on.
    pod_env = {"PLRL_NAMESPACE": "ns", "PLRL_POD_NAME": "demo-train-0"}
    with caplog.at_level(logging.WARNING, "plrl.heartbeat"):
        assert heartbeat.start(cfg, lambda: heartbeat.Report(role="trainer"), env=pod_env) is None
    assert "no heartbeat for demo-demo-train-0" in caplog.text and "KUBECONFIG is unset" in caplog.text
