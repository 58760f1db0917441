"""`plrl run`: whole jobs as local processes, checked the way a user would check them.

Each run costs tens of seconds of process start-up (torch, transformers imports), so the
assertions about one run share it.
"""

from __future__ import annotations

import json
import math
import pathlib
import signal
import subprocess
import time

import pytest

from plrl_api import records
from plrl_operator.local import report
from plrl_workers import checkpoint
from tests.infra import procs
from tests.operator.local.conftest import SMALL_JOB, plrl, plrl_argv, plrl_env, write_job

pytestmark = pytest.mark.slow


def test_an_invalid_job_fails_before_any_process_starts(
    tmp_path: pathlib.Path, run_dir: pathlib.Path
) -> None:
    job = write_job(tmp_path / "bad.yaml", training={"batchSize": 10})
    r = plrl("run", str(job), "--run-dir", str(run_dir), timeout=120)
    assert r.returncode == 2
    assert "training.batchSize=10 must be a multiple of generation.samplesPerPrompt=4" in r.stderr
    assert not run_dir.exists()
    # An override is validated like the file: the same refusal, before anything starts.
    good = write_job(tmp_path / "good.yaml")
    r = plrl("run", str(good), "--run-dir", str(run_dir), "--set", "spec.training.batchSize=10", timeout=120)
    assert r.returncode == 2 and "training.batchSize=10 must be a multiple" in r.stderr
    assert not run_dir.exists()


def test_a_reward_that_cannot_be_imported_fails_before_any_process_starts(
    tmp_path: pathlib.Path, run_dir: pathlib.Path
) -> None:
    job = write_job(tmp_path / "bad.yaml", task={"reward": "no_such_module.rewards:score"})
    r = plrl("run", str(job), "--run-dir", str(run_dir), timeout=120)
    assert r.returncode == 2
    assert "task.reward" in r.stderr and "no_such_module" in r.stderr
    assert not run_dir.exists()


def _accounting(run_dir: pathlib.Path) -> records.PromptCounts:
    return report.read_records(run_dir)[-1].prompts


def test_batches_entirely_older_than_max_lag_are_skipped_and_reported(
    tmp_path: pathlib.Path, run_dir: pathlib.Path
) -> None:
    # maxLag 0: whatever was generated before the last update is dropped, so whole batches go.
    job = write_job(tmp_path / "job.yaml", pipeline={"maxLag": 0})
    r = plrl("run", str(job), "--run-dir", str(run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((run_dir / report.SUMMARY_FILE).read_text())
    assert summary["steps"] == 8
    a = _accounting(run_dir)
    assert a.dropped_by_lag > 0 and a.trained >= 8  # every step trained at least one prompt
    assert a.balanced
    if a.outstanding:
        assert f"note: {a.outstanding} issued prompts were not trained" in r.stdout
    trainer_log = (run_dir / "logs" / "trainer-0.log").read_text()
    assert "dropped by the lag policy (maxLag 0); no step" in trainer_log
    assert r.leftover == []


def test_conventional_run_alternates_with_no_lag(tmp_path: pathlib.Path, run_dir: pathlib.Path) -> None:
    job = write_job(tmp_path / "job.yaml", pipeline={"mode": "conventional"})
    r = plrl("run", str(job), "--run-dir", str(run_dir), "--steps", "3")  # the command line shortens it
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((run_dir / report.SUMMARY_FILE).read_text())
    assert summary["steps"] == 3
    assert summary["lag_max"] == 0 and summary["mixed_version_samples"] == 0
    a = _accounting(run_dir)
    assert a.issued == a.trained == 3 * 16 // 4


def test_a_run_with_every_lag_compensation_option_applies_each(
    tmp_path: pathlib.Path, run_dir: pathlib.Path
) -> None:
    """staleWeight, behaviourKL and delayCompensation reach the trainer of a real pipelined run: each
    leaves its trace in the step records (stale samples weighted, the KL penalty's estimate, the lag
    the delay-compensated step corrected for)."""
    job = write_job(
        tmp_path / "job.yaml",
        training={
            **SMALL_JOB["spec"]["training"],
            "delayCompensation": 0.5,
            "loss": {"staleWeight": 0.3, "behaviourKL": 0.1},
        },
    )
    r = plrl("run", str(job), "--run-dir", str(run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = report.read_records(run_dir)
    assert len(rows) == 8 and all(math.isfinite(row.loss) for row in rows)
    lagged = [row for row in rows if row.lag_mean > 0]
    assert lagged, "the pipeline trained nothing stale: nothing to compensate"
    assert any((row.details.get("dc_lag") or 0) >= 1 for row in rows)
    assert any((row.details.get("lag/samples_stale") or 0) > 0 for row in lagged)
    assert all((row.details.get("kl_k3") or 0) >= 0 for row in rows)
    assert any((row.details.get("kl_k3") or 0) > 0 for row in lagged)


def test_interrupted_run_resumes_from_its_last_checkpoint(
    tmp_path: pathlib.Path, run_dir: pathlib.Path
) -> None:
    # Long enough that Ctrl-C lands mid-run: the small job trains a step in well under 0.1 s.
    total = 60
    job = write_job(tmp_path / "job.yaml", training={"totalSteps": total, "checkpoint": {"everySteps": 2}})
    argv = plrl_argv("run", str(job), "--run-dir", str(run_dir))
    with procs.Tree(argv, env=plrl_env(), stderr=subprocess.STDOUT) as tree:
        first = tree.proc
        deadline = time.monotonic() + 300
        while checkpoint.latest(run_dir / "checkpoints") is None:
            assert first.poll() is None, first.communicate()[0]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.1)
        first.send_signal(signal.SIGINT)  # what Ctrl-C does (to `plrl run` only: workers have sessions)
        out, _ = first.communicate(timeout=120)
        assert first.returncode == 130, out
        assert "resumes from the last checkpoint" in out
        # The summary says what happened: stopped early, prompts in flight are not lost.
        assert f" of {total} (interrupted)" in out
        assert "replaced prompts the lag policy dropped" not in out
        assert tree.survivors() == []  # it stopped every worker before exiting
    latest = checkpoint.latest(run_dir / "checkpoints")
    assert latest is not None
    saved = checkpoint.read_meta(latest)
    assert saved.step < total
    metrics = run_dir / records.METRICS_FILE
    before = records.read_step_records(metrics.read_text())

    second = plrl("run", str(job), "--run-dir", str(run_dir))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming" in second.stdout
    # It continues right after the checkpoint: the steps trained after it were forgotten with the
    # model (their rows dropped from metrics.jsonl) and trained again, so the file is the final
    # model's history, every step once.
    after = records.read_step_records(metrics.read_text())
    assert [row.step for row in after] == list(range(1, total + 1))
    assert after[: saved.step] == before[: saved.step]
    assert report.read_records(run_dir) == after
    a = _accounting(run_dir)
    assert a.issued == a.trained + a.dropped_by_lag and a.outstanding == 0
