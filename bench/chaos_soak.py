"""Chaos soak: one `plrl run` job surviving seeded random faults, with their cost per kind (not a test).

Runs a 2-generator job (bench/jobs/chaos.yaml: the tiny model, 1 s heartbeats, 4 s timeout) with
`--chaos random:N:seed=S` (kills, stops and slows of random generators and trainer rank 0), then
reads the run's `chaos.json` and `metrics.jsonl` and prints, per fault kind: faults injected,
restarts they caused, detection time (fault -> restart of its target), time until the job trained
again, and throughput lost (steps/s in the 20 s after a fault vs the 20 s before); and the
accounting check: every step of the final model's history present once, every prompt issued trained
once or reported dropped, none outstanding. Exit status 1 if the job did not finish or the check fails.

    .venv/bin/python bench/chaos_soak.py [--faults 12] [--seed 1] [--steps 400] [--out runs/bench-chaos]

`make chaos` runs it with more faults (see the Makefile); tests/operator/local/test_failover.py runs a
short seeded version in CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

from plrl_api import records  # noqa: E402
from plrl_operator import jobfile  # noqa: E402
from plrl_operator.local import chaos_report, report, runner  # noqa: E402

JOB = ROOT / "bench" / "jobs" / "chaos.yaml"


@dataclasses.dataclass(frozen=True)
class ChaosRun:
    """One `plrl run --chaos` of the soak's job and what it cost."""

    returncode: int
    wall_s: float
    costs: list[chaos_report.FaultCost]
    history_ok: bool
    """Every step of the final model's history present once."""
    prompts: records.PromptCounts | None

    @property
    def accounting_ok(self) -> bool:
        a = self.prompts
        return a is not None and a.outstanding == 0 and a.issued == a.trained + a.dropped_by_lag

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.history_ok and self.accounting_ok


def run_chaos(chaos: str, steps: int, out: pathlib.Path, quiet: bool = False) -> ChaosRun:
    """`plrl run bench/jobs/chaos.yaml --steps STEPS --chaos CHAOS` into `out` (emptied first)."""
    if out.exists():
        shutil.rmtree(out)
    argv = [sys.executable, "-m", "plrl_operator.cli", "run", str(JOB), "--run-dir", str(out)]
    argv += ["--steps", str(steps), "--chaos", chaos]
    print("$", " ".join(argv[2:]), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(
        argv,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
        check=False,
        stdout=subprocess.DEVNULL if quiet else None,
    )
    wall = time.monotonic() - t0
    costs = chaos_report.fault_costs(json.loads((out / runner.CHAOS_FILE).read_text()))
    rows = records.read_step_records((out / records.METRICS_FILE).read_text())
    prompts = report.read_records(out)[-1].prompts if rows else None
    history_ok = [r.step for r in rows] == list(range(1, steps + 1))
    return ChaosRun(proc.returncode, wall, costs, history_ok, prompts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=12, help="random faults to inject (N of random:N)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=400, help="spec.training.totalSteps")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "runs" / "bench-chaos")
    args = ap.parse_args()
    run = run_chaos(f"random:{args.faults}:seed={args.seed}", args.steps, args.out)
    job = jobfile.load_job(JOB)
    print(f"\nexit {run.returncode} after {run.wall_s:.0f} s; {len(run.costs)} faults injected")
    print(
        f"heartbeat: interval {job.spec.heartbeat.interval_seconds:g} s, timeout "
        f"{job.spec.heartbeat.timeout_seconds:g} s (a hang's detection bound: "
        f"{job.spec.heartbeat.interval_seconds + job.spec.heartbeat.timeout_seconds:g} s)"
    )
    for c in run.costs:
        print(
            f"  t={c.at_s:7.1f}s {c.kind:<4} {c.target:<12} detection "
            f"{'-' if c.detection_s is None else f'{c.detection_s:.1f} s':>7}  training again after "
            f"{'-' if c.recovery_s is None else f'{c.recovery_s:.1f} s':>7}  throughput lost "
            f"{'-' if c.throughput_lost is None else f'{c.throughput_lost:.0%}'}"
        )
    for kind in chaos_report.by_kind(run.costs):
        print(kind.line())
    print(f"accounting: history complete once per step {run.history_ok}; prompts {run.prompts}")
    return 0 if run.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
