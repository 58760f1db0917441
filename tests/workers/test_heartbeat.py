"""The worker Lease a heartbeat applies, built without a cluster (plrl_workers.heartbeat's pure half).

Cases: the operator's own reader (`status.progress_from_leases`, `status.compute_status` after
`policy.decide`) gets back exactly the trainer's step record (step, version, lag, reward, tokens/s,
ratio) and `finished`;
every other worker's numbers land in string annotations, with None fields left out and non-finite
or out-of-range numbers never written as such; no progress before trainer rank 0 has a row unless
the job is already finished; the Lease's name, labels, holder, duration (ceil of the timeout),
MicroTime stamps and job ownership; the target comes from the operator-rendered worker config
plus the pod's identity, and is absent under `plrl run` (no pod name), where `start` starts nothing.
"""

from __future__ import annotations

import datetime
import json
import logging
import pathlib

import pytest

from plrl_api import identity, names, plan, records, spec, worker_config
from plrl_operator import status
from plrl_operator.policy import decide
from plrl_operator.render import config as render_config
from plrl_workers import heartbeat
from tests import samples
from tests.polling import eventually

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
ROW = samples.step_record()  # what trainer.Coordination.log_step writes


def _job() -> spec.PipelineRLJob:
    return samples.job(
        {
            "model": {"name": "/models/demo"},
            "resources": {"totalGPUs": 4},
            "pipeline": {"generators": 2},
            "heartbeat": {"intervalSeconds": 2, "timeoutSeconds": 7.5},
        },
        uid="uid-1",
    )


def _worker_config(role: names.Role) -> worker_config.WorkerConfig:
    """What the operator mounts at /etc/plrl/<role>.json (read back from the rendered ConfigMap)."""
    job = _job()
    cm = render_config.config_map(job, plan.PodPlan.of(job.spec, 2))
    return worker_config.WorkerConfig.model_validate_json(cm["data"][f"{role}.json"])


def _pod(pod: str) -> identity.Identity:
    """A pod's identity as its env gives it (downward API)."""
    return identity.Identity.from_env(
        samples.token_env()
        | {names.ENV_NAMESPACE: "ns", names.ENV_POD_NAME: pod, names.ENV_POD_INDEX: "0"}
        | {names.ENV_POD_UID: f"uid-of-{pod}"}
    )


def _target(role: names.Role = "trainer", pod: str = "demo-train-0") -> heartbeat.Target:
    tgt = heartbeat.target(_worker_config(role), _pod(pod))
    assert tgt is not None
    return tgt


def test_the_operator_reads_back_the_trainers_row() -> None:
    rep = heartbeat.trainer_report(
        ROW, step=12, weight_version=12, finished=False, tokens_per_second=950.0, queue_depth=4
    )
    lease = heartbeat.lease(_target(), rep, now=T0, acquired=T0)
    got = status.progress_from_leases([lease])
    assert got == records.Progress(
        step=12,
        weight_version=12,
        lag=records.Lag(mean=1.25, max=3),
        reward=0.375,
        throughput=records.Throughput(
            generated_tokens_per_second=800.0, trained_tokens_per_second=1000.0, ratio=1.25
        ),
        finished=False,
    )
    ann = lease["metadata"]["annotations"]
    assert {k: v for k, v in ann.items() if k != names.ANNOTATION_PROGRESS} == {
        "pipelinerl.io/role": "trainer",
        "pipelinerl.io/weight-version": "12",
        "pipelinerl.io/tokens-per-second": "950.0",
        "pipelinerl.io/queue-depth": "4",
        "pipelinerl.io/utilisation": "0.750",  # busy 3 s of a 4 s step
        "pipelinerl.io/capacity-tokens-per-second": "300.0",  # 900 completion tokens in 3 busy s
        "pipelinerl.io/pod-uid": "uid-of-demo-train-0",
    }


def test_finished_reaches_the_job_status() -> None:
    job = _job()
    rep = heartbeat.trainer_report(
        ROW.model_copy(update={"step": 1000, "version": 1000}), step=1000, weight_version=1000, finished=True
    )
    pod = {
        "metadata": {
            "name": "demo-train-0",
            "uid": "uid-of-demo-train-0",  # the pod that wrote the Lease
            "labels": {names.LABEL_ROLE: names.TRAINER},
            "creationTimestamp": "2026-01-01T11:00:00Z",
        }
    }
    children = status.Children(pods=[pod], leases=[heartbeat.lease(_target(), rep, now=T0, acquired=T0)])
    verdict = decide.decide(job.spec, status.observation(children), decide.History())
    s = status.compute_status(job, 2, children, status.JobStatus(phase="Running"), T0, verdict.history)
    assert s.phase == "Succeeded" and s.step == 1000


def test_no_progress_before_the_first_step_unless_already_finished() -> None:
    early = heartbeat.trainer_report(None, step=0, weight_version=0, finished=False)
    assert names.ANNOTATION_PROGRESS not in records.lease_annotations(early)
    assert records.lease_annotations(early) == {
        "pipelinerl.io/role": "trainer",
        "pipelinerl.io/weight-version": "0",
    }
    # A job resumed from its final checkpoint has no new row but must still say it is done.
    done = heartbeat.trainer_report(None, step=50, weight_version=50, finished=True)
    assert done.progress == records.Progress(step=50, weight_version=50, finished=True)


def test_generator_annotations() -> None:
    rep = heartbeat.generator_report(
        weight_version=7, tokens_per_second=1234.56, in_flight=96, capacity=128, queue_depth=2
    )
    assert records.lease_annotations(rep) == {
        "pipelinerl.io/role": "generator",
        "pipelinerl.io/weight-version": "7",
        "pipelinerl.io/tokens-per-second": "1234.6",
        "pipelinerl.io/queue-depth": "2",
        "pipelinerl.io/utilisation": "0.750",
    }


def test_bad_numbers_are_never_written_as_such() -> None:
    row = ROW.model_copy(
        update={"reward_mean": float("nan"), "generated_tokens_per_s": 0.0, "lag_mean": float("inf")}
    )
    prog = records.progress(row)
    assert prog.reward is None  # a batch without samples: no reward, not NaN
    assert prog.throughput.ratio == 0.0 and prog.lag.mean == 0.0
    json.loads(prog.model_dump_json())  # valid JSON (NaN would not be)
    ann = records.lease_annotations(
        records.WorkerReport(role="generator", tokens_per_second=float("nan"), utilisation=1.7)
    )
    assert ann == {"pipelinerl.io/role": "generator", "pipelinerl.io/utilisation": "1.000"}
    assert records.lease_annotations(records.WorkerReport(role="trainer")) == {
        "pipelinerl.io/role": "trainer"
    }
    # ... and what the operator reads back from a Lease is bounded the same way.
    back = records.parse_annotations(ann | {names.ANNOTATION_WEIGHT_VERSION: "not-a-number"})
    assert back is not None and back.weight_version is None and back.utilisation == 1.0


def test_lease_shape() -> None:
    now = T0 + datetime.timedelta(seconds=3, microseconds=250)
    lease = heartbeat.lease(
        _target("generator", "demo-gen-1"), records.WorkerReport(role="generator"), now=now, acquired=T0
    )
    assert lease["metadata"]["name"] == "demo-demo-gen-1"  # `<job>-<pod>`
    assert lease["metadata"]["namespace"] == "ns"
    assert lease["metadata"]["labels"] == {"pipelinerl.io/job": "demo", "pipelinerl.io/role": "generator"}
    # The pod's incarnation: a pod recreated under its name is not credited with the old one's beats.
    assert lease["metadata"]["annotations"][names.ANNOTATION_POD_UID] == "uid-of-demo-gen-1"
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


def test_plrl_run_processes_beat_into_the_run_directory(tmp_path: pathlib.Path) -> None:
    cfg = _worker_config("generator")
    cfg = cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"run_dir": str(tmp_path)})})
    local = identity.Identity.from_env(samples.token_env() | {names.ENV_POD_INDEX: "1"})  # as plrl run sets
    beat = heartbeat.start(cfg, local, lambda: records.WorkerReport(role="generator", weight_version=4))
    assert beat is not None and not beat.in_cluster
    path = tmp_path / records.HEARTBEAT_DIR / "generator-1.json"
    eventually(path.exists, what="the first renewal")
    lease = json.loads(path.read_text())
    assert names.ANNOTATION_RELEASED not in lease["metadata"]["annotations"]
    beat.stop()
    # An exiting worker is neither a hung one nor one still starting: its last renewal says so.
    released = json.loads(path.read_text())
    assert released["metadata"]["annotations"][names.ANNOTATION_RELEASED] == "true"
    assert released["spec"]["renewTime"] >= lease["spec"]["renewTime"]
    assert lease["spec"]["holderIdentity"] == "generator-1"
    assert lease["metadata"]["annotations"][names.ANNOTATION_WEIGHT_VERSION] == "4"
    renewed = datetime.datetime.fromisoformat(lease["spec"]["renewTime"])
    assert abs((datetime.datetime.now(datetime.UTC) - renewed).total_seconds()) < 60


def test_outside_a_cluster_nothing_starts(caplog: pytest.LogCaptureFixture) -> None:
    cfg = _worker_config("trainer")
    cfg = cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"run_dir": None})})
    local = identity.Identity.from_env(samples.token_env())  # no pod, no run directory
    assert heartbeat.target(cfg, local) is None
    assert heartbeat.start(cfg, local, lambda: records.WorkerReport(role="trainer"), env={}) is None
    # A pod without credentials (e.g. automountServiceAccountToken: false): said once, then trains on.
    with caplog.at_level(logging.WARNING, "plrl.heartbeat"):
        assert (
            heartbeat.start(cfg, _pod("demo-train-0"), lambda: records.WorkerReport(role="trainer"), env={})
            is None
        )
    assert "no heartbeat for demo-demo-train-0" in caplog.text and "KUBECONFIG is unset" in caplog.text
    assert "take this worker for hung after heartbeat.startupTimeoutSeconds=900" in caplog.text
