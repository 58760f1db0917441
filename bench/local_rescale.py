"""What one change of I costs under `plrl run`: scale-up and scale-down, alternated, repeated.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/local_rescale.py [--repeats 3] [--steps 60]

Each run is `plrl run bench/jobs/autoscale.yaml` (3 CPU "accelerators", autoscale every 5 steps,
cool-down 10) made imbalanced by `--chaos`: a generator slowed 8x from I = 1 (the autoscaler adds
one: scale-up) or a trainer slowed 8x from I = 2 (it removes one: scale-down). From the run's
`autoscale.json` it prints the change's cost (seconds from the decision until training passed the
step it had reached: trainer restart, checkpoint load, steps trained again), the decision period
(max(everySteps, cooldownSteps) steps at the median step time before the change) and their ratio,
the throughput lost as a fraction of a decision period. From the workers' logs, against the
decision's wall time: when the new trainer group had loaded its checkpoint and trained its first
step (the elastic restart), and for a scale-up when the joining generator's first rollout group
was taken and when it first received weights in flight. Headline: median (min-max) per direction.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402

JOB = ROOT / "bench" / "jobs" / "autoscale.yaml"
CASES = {
    "scale-up": ["--set", "spec.pipeline.generators=1", "--chaos", "slow:generator-0@step=3:8x"],
    "scale-down": ["--set", "spec.pipeline.generators=2", "--chaos", "slow:trainer-0@step=3:8x"],
}


# Lines the workers log once per process, timed against the decision (seconds after it).
MARKS = {
    "trainer resumed": ("trainer-0", "resumed from"),
    "trainer first step": ("trainer-0", "first step of this process trained"),
    "generator first rollout": ("generator-1", "first rollout group taken"),
    "generator in weight-sync group": ("generator-1", "in the weight-sync group"),
}


def logged_after(log: pathlib.Path, needle: str, after: datetime.datetime) -> float | None:
    """Seconds from `after` to the first line of `log` holding `needle` logged after it."""
    if not log.exists():
        return None
    for line in log.read_text(errors="replace").splitlines():
        if needle not in line:
            continue
        # logging's default asctime: local time, "2026-12-04 15:30:00,123"
        stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").astimezone()
        if stamp >= after:
            return (stamp - after).total_seconds()
    return None


def one(case: str, steps: int) -> dict[str, float] | None:
    """The run's first change: its cost, the decision period and the marks (seconds), or None if
    it made none."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = pathlib.Path(tmp) / "run"
        argv = [sys.executable, "-m", "plrl_operator.cli", "run", str(JOB), "--steps", str(steps)]
        argv += ["--run-dir", str(run_dir), "--quiet", *CASES[case]]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        doc = json.loads((run_dir / "autoscale.json").read_text())
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        if not doc["changes"] or doc["lastChangeCostSeconds"] is None:
            return None
        first = doc["changes"][0]
        decided = datetime.datetime.fromisoformat(first["at"])
        got = {"cost": float(doc["lastChangeCostSeconds"])}
        for mark, (worker, needle) in MARKS.items():
            if (t := logged_after(run_dir / "logs" / f"{worker}.log", needle, decided)) is not None:
                got[mark] = t
    before = sorted(r["step_s"] for r in rows if first["step"] - 10 < r["step"] <= first["step"])
    got["period"] = 10 * before[len(before) // 2] if before else float("nan")  # max(everySteps, cooldown)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    got: dict[str, list[dict[str, float]]] = {c: [] for c in CASES}
    for k in range(args.repeats):
        for case in CASES:  # alternated, so drift in machine load hits both directions alike
            r = one(case, args.steps)
            if r is None:
                print(f"repeat {k} {case:10}: no change made", flush=True)
                continue
            marks = ", ".join(f"{m} +{r[m]:.1f} s" for m in MARKS if m in r)
            print(
                f"repeat {k} {case:10}: cost {r['cost']:.1f} s, decision period {r['period']:.1f} s, "
                f"lost {r['cost'] / r['period']:.2f} of a period; {marks}",
                flush=True,
            )
            got[case].append(r)
    for case, rs in got.items():
        if not rs:
            continue
        cost = stats.fmt_spread([r["cost"] for r in rs], ".1f")
        lost = stats.fmt_spread([r["cost"] / r["period"] for r in rs], ".2f")
        print(f"{case:10}: cost {cost} s, lost {lost} of a decision period, {len(rs)} runs")
        for mark in MARKS:
            if ts := [r[mark] for r in rs if mark in r]:
                print(f"{'':10}  decision -> {mark}: {stats.fmt_spread(ts, '.1f')} s ({len(ts)} runs)")


if __name__ == "__main__":
    main()
