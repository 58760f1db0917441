"""Pipeline vs conventional RL: the same job, the same machine, the same number of trained samples.

Runs `plrl run` on the job twice in one invocation, once per `pipeline.mode`, and prints the ratios
the paper's claim is about: trained tokens per second, and wall time until the reward's moving
average first reaches a target both runs reach (default: 80% of the way from the starting reward to
the lower of the two final rewards).
Times start when each run's first batch is in (process start-up excluded, see trainer.py).

Each repeat runs both modes, the first mode alternating between repeats (machine load drifts); each
ratio is taken within a repeat and printed as the median (min-max) over the repeats.

    .venv/bin/python bench/pipeline_vs_conventional.py examples/local-tiny.yaml   # 3 repeats
    .venv/bin/python bench/pipeline_vs_conventional.py examples/local-tiny.yaml --steps 60 --repeats 1
"""

from __future__ import annotations

import argparse
import math
import pathlib
import shlex
import statistics
import sys
import tempfile
from typing import Any

import yaml

from plrl_api import records

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import runs, stats


def run_mode(
    job_doc: dict[str, Any], mode: str, steps: int | None, workdir: pathlib.Path
) -> list[records.StepRecord]:
    extra = {} if steps is None else {"training__totalSteps": steps}
    name = f"{job_doc['metadata']['name']}-{mode}"
    return runs.run_job(runs.edited(job_doc, name, pipeline__mode=mode, **extra), workdir)


def time_to(curve: list[tuple[float, float]], target: float) -> float:
    return next((t for t, r in curve if r >= target), math.inf)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", type=pathlib.Path)
    ap.add_argument("--steps", type=int, help="override training.totalSteps")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each mode, alternated")
    ap.add_argument("--target", type=float, help="reward target (default: see the module docstring)")
    ap.add_argument("--window", type=int, default=5, help="moving-average window for the reward, in steps")
    args = ap.parse_args()
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)
    job_doc = yaml.safe_load(args.job.read_text())
    results: dict[str, list[list[records.StepRecord]]] = {"pipeline": [], "conventional": []}
    with tempfile.TemporaryDirectory(prefix="plrl-bench-") as tmp:
        for rep in range(args.repeats):
            order = ("pipeline", "conventional") if rep % 2 == 0 else ("conventional", "pipeline")
            for mode in order:
                wd = pathlib.Path(tmp) / f"{rep}"
                wd.mkdir(exist_ok=True)
                results[mode].append(run_mode(job_doc, mode, args.steps, wd))
    finals = {
        m: statistics.fmean(runs.last_tenth(rows) for rows in mode_runs) for m, mode_runs in results.items()
    }
    starts = [runs.first_tenth(rows) for mode_runs in results.values() for rows in mode_runs]
    start = statistics.fmean(starts)
    target = args.target if args.target is not None else start + 0.8 * (min(finals.values()) - start)
    print(
        f"{'mode':<13}{'wall s':>9}{'trained tok/s':>15}{'gen tok/s':>11}{'final reward':>14}"
        f"{'t(reward>=' + format(target, '.3f') + ') s':>22}{'lag mean':>10}"
    )
    summary: dict[str, dict[str, float]] = {}
    for mode, mode_runs in results.items():
        walls = [rows[-1].elapsed_s for rows in mode_runs]
        trained = [rows[-1].trained_tokens_per_s for rows in mode_runs]
        generated = [rows[-1].generated_tokens_per_s for rows in mode_runs]
        reach = [time_to(runs.smoothed(rows, args.window), target) for rows in mode_runs]
        lag = [statistics.fmean(r.lag_mean for r in rows) for rows in mode_runs]
        summary[mode] = {
            "wall": statistics.median(walls),
            "trained": statistics.median(trained),
            "reach": statistics.median(reach),
        }
        print(
            f"{mode:<13}{summary[mode]['wall']:>9.1f}{summary[mode]['trained']:>15.0f}"
            f"{statistics.median(generated):>11.0f}{finals[mode]:>14.3f}{summary[mode]['reach']:>22.1f}"
            f"{statistics.fmean(lag):>10.2f}"
        )
    pipe, conv = results["pipeline"], results["conventional"]
    tok = [p[-1].trained_tokens_per_s / c[-1].trained_tokens_per_s for p, c in zip(pipe, conv, strict=True)]
    wall = [c[-1].elapsed_s / p[-1].elapsed_s for p, c in zip(pipe, conv, strict=True)]
    reach = [
        time_to(runs.smoothed(c, args.window), target) / time_to(runs.smoothed(p, args.window), target)
        for p, c in zip(pipe, conv, strict=True)
    ]
    print(
        f"\npipeline / conventional, median (min-max) of {args.repeats} repeat(s): "
        f"trained tokens/s {stats.fmt_spread(tok, '.2f', 'x')}, "
        f"wall time for the same steps {stats.fmt_spread(wall, '.2f', 'x')} faster, "
        f"time to reward {target:.3f} {stats.fmt_spread(reach, '.2f', 'x')} faster"
        " (paper's model: 1.57x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
