"""End to end: `kubectl apply -f examples/cluster-tiny.yaml` trains the tiny job on the real control plane.

The chart is installed, the operator runs as a process with the chart's ServiceAccount token, and the
fake GPU nodes' pods really run (the node agent's process runner): every worker starts from its pod's
command, env and volumes, renews its Lease with the pod's own ServiceAccount token, and finds its peers
by their pod DNS names.

Cases: 1 generator + 1 trainer: `kubectl get plrljobs` shows Running with STEP climbing, then
Succeeded at totalSteps with no restarts; the trainer's final step record (on the checkpoint volume)
accounts for every prompt (issued = trained + dropped, none outstanding) and samples carry tokens of 2+
weight versions; `kubectl logs` works while it trains; the pods stop and stay stopped, the checkpoints
stay; re-applying the file changes nothing, and deleting and re-applying the job trains nothing (the
trainer resumes from the last checkpoint, already at totalSteps); `plrl run` of the same job gives the
same trained-step count and accounting. 2 trainer pods: torch.distributed rendezvous through the pod
DNS names, both ranks train every step.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable

import pytest

from plrl_api import records
from plrl_operator.local import report
from tests.infra import tools
from tests.operator.cluster import e2e, support
from tests.operator.cluster.support import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]
TOTAL_STEPS = 40  # examples/cluster-tiny.yaml
PROMPTS_PER_STEP = 64 // 8  # B / G


def _climbing(seen: list[e2e.Seen]) -> list[int]:
    """The distinct STEP values `kubectl get plrljobs` showed while the job was Running."""
    steps = [
        int(s.row["STEP"])
        for s in seen
        if s.row.get("PHASE") == "Running" and s.row.get("STEP", "").isdigit()
    ]
    return sorted(set(steps))


def _accounted(last: records.StepRecord, steps: int) -> None:
    p = last.prompts
    assert p.balanced and p.outstanding == 0, p
    assert p.trained + p.dropped_by_lag == p.issued == steps * PROMPTS_PER_STEP, p


def test_kubectl_apply_trains_the_tiny_job_to_succeeded(
    operator: support.Operator,
    kubectl: tools.Tool,
    namespace: str,
    tiny: Callable[..., e2e.Tiny],
    demo_models: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    job = tiny()
    assert job.apply() == "pipelinerljob.pipelinerl.io/tiny created"
    seen = job.watch("Succeeded", timeout_s=240, stop_at_step=2)
    trainer_log = kubectl("logs", "tiny-train-0", "-n", namespace, "--tail", "200").stdout  # while it trains
    seen += job.watch("Succeeded", timeout_s=240)
    first_step = next(s.at_s for s in seen if s.row.get("STEP", "").isdigit() and int(s.row["STEP"]) >= 1)
    print(f"\napply -> first trained step {first_step:.1f} s, -> Succeeded {seen[-1].at_s:.1f} s")

    climbing = _climbing(seen)
    assert len(climbing) >= 3 and climbing[0] < TOTAL_STEPS, f"STEP did not climb while Running: {climbing}"
    final = seen[-1].row
    assert (final["PHASE"], final["STEP"], final["RESTARTS"], final["GEN"], final["TRAIN"]) == (
        "Succeeded",
        str(TOTAL_STEPS),
        "0",
        "1",
        "1",
    )
    assert "resumed" not in trainer_log and "rank0" in trainer_log

    rows = job.records()
    assert [r.step for r in rows] == list(range(1, TOTAL_STEPS + 1))
    _accounted(rows[-1], TOTAL_STEPS)
    assert sum(r.mixed_version_samples for r in rows) > 0, "no sample holds tokens of 2+ weight versions"
    assert max(r.lag_max for r in rows) >= 1

    # Finished: no pod runs, none comes back, the checkpoints stay on their volume.
    eventually(lambda: not job.pods(), 60, "the job's pods to stop")
    time.sleep(3)  # three operator ticks and StatefulSet syncs
    assert not job.pods(), "a succeeded job's pods were started again"
    assert (job.checkpoints / f"step-{TOTAL_STEPS:08d}").is_dir()
    condition = next(c for c in job.status()["conditions"] if c["type"] == "Succeeded")
    assert condition["message"] == f"trainers finished training.totalSteps={TOTAL_STEPS}"

    # The same file again: nothing to do.
    lines = job.metrics_lines()
    assert job.apply() == "pipelinerljob.pipelinerl.io/tiny unchanged"
    time.sleep(3)
    assert job.row()["PHASE"] == "Succeeded" and not job.pods()

    # Deleted and applied again on the same checkpoint volume: resumes at the end, trains nothing.
    kubectl("delete", "plrljob", "tiny", "-n", namespace, "--wait=true", "--timeout=60s")
    assert job.apply() == "pipelinerljob.pipelinerl.io/tiny created"
    again = job.watch("Succeeded", timeout_s=180)
    assert again[-1].row["STEP"] == str(TOTAL_STEPS)
    assert job.metrics_lines() == lines, "a finished job trained again"
    resumed = (job.log_tails(200) if job.node_state else "") or ""
    assert job.node_state is None or f"resumed from /checkpoints: step {TOTAL_STEPS}" in resumed

    # `plrl run`: the same spec and worker code, on this machine; the same steps and accounting.
    local = e2e.job_file_for_plrl_run(job.doc, demo_models / "tiny", tmp_path / "local.yaml")
    run = e2e.plrl_run(local, tmp_path / "run")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    local_rows = report.read_records(tmp_path / "run")
    assert len(local_rows) == len(rows) == TOTAL_STEPS
    assert local_rows[-1].prompts.model_dump() == rows[-1].prompts.model_dump()


def test_two_trainer_pods_rendezvous_through_their_dns_names(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    steps = 15
    job = tiny(resources={"totalGPUs": 3}, training={"totalSteps": steps, "checkpoint": {"everySteps": 5}})
    job.apply()
    seen = job.watch("Succeeded", timeout_s=300)
    assert (seen[-1].row["TRAIN"], seen[-1].row["STEP"], seen[-1].row["RESTARTS"]) == ("2", str(steps), "0")
    rows = job.records()
    assert [r.step for r in rows] == list(range(1, steps + 1))
    _accounted(rows[-1], steps)
    logs = job.log_tails(400)
    assert "rank1" in logs and "rank0" in logs, logs
    assert (job.checkpoints / f"step-{steps:08d}" / "rng" / "rank1.pt").is_file(), "rank 1 did not checkpoint"
