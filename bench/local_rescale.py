"""What one change of I costs under `plrl run`: scale-up and scale-down, alternated, repeated.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/local_rescale.py [--repeats 3] [--steps 60]

Each run is `plrl run bench/jobs/autoscale.yaml` (3 CPU "accelerators", autoscale every 5 steps,
cool-down 10) made imbalanced by `--chaos`: a generator slowed 8x from I = 1 (the autoscaler adds
one: scale-up) or a trainer slowed 8x from I = 2 (it removes one: scale-down). From the run's
`autoscale.json` it prints the change's cost (seconds from the decision until training passed the
step it had reached: trainer restart, checkpoint load, steps trained again), the decision period
(max(everySteps, cooldownSteps) steps at the median step time before the change) and their ratio,
the throughput lost as a fraction of a decision period. Headline: median (min-max) per direction.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
JOB = ROOT / "bench" / "jobs" / "autoscale.yaml"
CASES = {
    "scale-up": ["--set", "spec.pipeline.generators=1", "--chaos", "slow:generator-0@step=3:8x"],
    "scale-down": ["--set", "spec.pipeline.generators=2", "--chaos", "slow:trainer-0@step=3:8x"],
}


def one(case: str, steps: int) -> tuple[float, float] | None:
    """(cost_s, period_s) of the run's first change, or None if it made none."""
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
    before = sorted(r["step_s"] for r in rows if first["step"] - 10 < r["step"] <= first["step"])
    period = 10 * before[len(before) // 2] if before else float("nan")  # max(everySteps=5, cooldown=10)
    return float(doc["lastChangeCostSeconds"]), period


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    got: dict[str, list[tuple[float, float]]] = {c: [] for c in CASES}
    for k in range(args.repeats):
        for case in CASES:  # alternated, so drift in machine load hits both directions alike
            r = one(case, args.steps)
            print(
                f"repeat {k} {case:10}: "
                + (
                    "no change made"
                    if r is None
                    else f"cost {r[0]:.1f} s, "
                    f"decision period {r[1]:.1f} s, lost {r[0] / r[1]:.2f} of a period"
                ),
                flush=True,
            )
            if r is not None:
                got[case].append(r)
    for case, rs in got.items():
        if not rs:
            continue
        costs, fractions = [c for c, _ in rs], [c / p for c, p in rs]
        print(
            f"{case:10}: cost {statistics.median(costs):.1f} s ({min(costs):.1f}-{max(costs):.1f}), "
            f"lost {statistics.median(fractions):.2f} of a decision period "
            f"({min(fractions):.2f}-{max(fractions):.2f}), {len(rs)} runs"
        )


if __name__ == "__main__":
    main()
