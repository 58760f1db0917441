"""`plrl run` with `pipeline.autoscale.enabled`: a job made imbalanced by `--chaos` is rescaled.

Three CPU "accelerators". A generator slowed 8x makes generation the bottleneck, so I goes 1 -> 2
(the trainers checkpoint the step they reached and restart from it with one rank instead of two); a
trainer slowed 8x does the opposite, 2 -> 1. What a user must see: the change and its ratio on the
terminal and in `autoscale.json`, the generator that stays keeps its process (its heartbeat was
acquired before the resize restarted the trainers), no failover restart, every step trained once,
and prompt accounting intact at the end.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import re

import pytest

from plrl_api import records
from plrl_operator.local import autoscaling, report, runner
from tests.operator.local.conftest import plrl, write_job

pytestmark = pytest.mark.slow
STEPS = 40


def _job(tmp_path: pathlib.Path, generators: int) -> pathlib.Path:
    return write_job(
        tmp_path / "job.yaml",
        resources={"totalGPUs": 3},
        pipeline={
            "maxLag": 8,
            "generators": generators,
            "autoscale": {"enabled": True, "everySteps": 5, "cooldownSteps": 10},
        },
        # Periodic checkpoints at 20 and 40: a change (from step 5 on) resumes at its own step only
        # because the stopped trainers checkpointed the step they had reached.
        training={"totalSteps": STEPS, "checkpoint": {"everySteps": 20}},
        heartbeat={"intervalSeconds": 1, "timeoutSeconds": 4},
    )


def _acquired(run_dir: pathlib.Path, name: str) -> datetime.datetime:
    lease = json.loads((run_dir / records.HEARTBEAT_DIR / f"{name}.json").read_text())
    return datetime.datetime.fromisoformat(lease["spec"]["acquireTime"])


def _check_the_run(run_dir: pathlib.Path, out: str) -> dict[str, object]:
    rows = records.read_step_records((run_dir / records.METRICS_FILE).read_text())
    assert [row.step for row in rows] == list(range(1, STEPS + 1)), out
    a = report.read_records(run_dir)[-1].prompts
    assert a.outstanding == 0 and a.issued == a.trained + a.dropped_by_lag, a
    chaos = json.loads((run_dir / runner.CHAOS_FILE).read_text())
    assert chaos["restarts"] == [], chaos["restarts"]  # rescaling is not failover: nothing charged
    decisions: dict[str, object] = json.loads((run_dir / autoscaling.DECISIONS_FILE).read_text())
    return decisions


@pytest.mark.parametrize(
    ("start", "slowed", "want"),
    [(1, "generator-0", 2), (2, "trainer-0", 1)],
    ids=["slow-generator-gets-more-generators", "slow-trainer-gets-fewer"],
)
def test_an_imbalanced_job_is_rescaled_without_restarting_the_generator_that_stays(
    tmp_path: pathlib.Path, run_dir: pathlib.Path, start: int, slowed: str, want: int
) -> None:
    job = _job(tmp_path, start)
    r = plrl("run", str(job), "--run-dir", str(run_dir), "--chaos", f"slow:{slowed}@step=3:8x", timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    decisions = _check_the_run(run_dir, out)
    changes = decisions["changes"]
    assert isinstance(changes, list) and changes, decisions
    first = changes[0]
    assert (first["previous"], first["generators"]) == (start, want), first
    verb = "Adding" if want > start else "Removing"
    assert first["reason"].startswith(f"{verb} generator GPUs {start} -> {want}: ratio r_pipeline/r_gen = ")
    bottleneck = "generators" if want > start else "trainers"
    assert f"{bottleneck} are the bottleneck" in first["reason"]
    assert first["reason"] in out
    trainers_before, trainers_after = 3 - start, 3 - want
    assert f"{trainers_before} -> {trainers_after} trainer rank(s)" in out
    assert f"autoscaler: {len(changes)} change(s) of I: {start} -> {want} at step {first['step']}" in out
    resumed = re.findall(r"resumed from \S+: step (\d+)", (run_dir / "logs" / "trainer-0.log").read_text())
    assert resumed and int(resumed[0]) >= first["step"], (resumed, first)  # no step trained twice
    # generator-0 stays in both directions; the trainers were restarted by the resize.
    assert _acquired(run_dir, "generator-0") < _acquired(run_dir, "trainer-0")
    if want > start:  # the new generator joined and delivered rollouts; training went on and was timed
        assert "autoscaler: the last change of I cost " in out
        lease = json.loads((run_dir / records.HEARTBEAT_DIR / "generator-1.json").read_text())
        assert float(lease["metadata"]["annotations"]["pipelinerl.io/capacity-tokens-per-second"]) > 0
        _joined_with_weights_then_in_flight((run_dir / "logs" / "generator-1.log").read_text())


def _joined_with_weights_then_in_flight(log: str) -> None:
    """The joining generator pulled the current weights before any rollout of its was taken, and
    then received a later version in flight, as a member of the weight-sync group."""
    lines = log.splitlines()
    where = {
        key: next((i for i, line in enumerate(lines) if key in line), None)
        for key in ("pulled full weights v", "first rollout group taken", "in the weight-sync group")
    }
    pulled, delivered, joined = where.values()
    assert pulled is not None and delivered is not None and joined is not None, (where, log[-3000:])
    assert pulled < delivered, log[-3000:]
    v_pulled = int(re.findall(r"pulled full weights v(\d+)", lines[pulled])[0])
    v_in_flight = int(re.findall(r"weights v(\d+) applied in flight", lines[joined])[0])
    assert v_in_flight > v_pulled, (lines[pulled], lines[joined])
