"""Lag compensation, measured: every option against the default (truncated IS) and conventional RL.

For each task and seed it runs the job once per variant, the variants alternated (their order
rotated by one per seed, so load drift hits all alike), all at the same number of optimizer steps,
hence the same number of samples:

  conventional   pipeline.mode conventional: no lag at all (the per-sample reference)
  default        the pipeline with truncated importance weights (training.loss.name reinforce_tis)
  stale-0.3      + training.loss.staleWeight 0.3 (the seed's 1 : 0.3 mix)
  kl-0.1         + training.loss.behaviourKL 0.1
  dc-0.5         + training.delayCompensation 0.5 (DC-ASGD; the torch backend)

Each task runs its own example job (its documented recipe: `reverse` examples/local-tiny.yaml, the
demo, `arith` examples/local-arith.yaml) at its own totalSteps unless `--job` / `--steps` say
otherwise. A seed sets training.seed and task.seed (data order, sampling); the warm-started model is the same
for every seed, so the spread is that of the RL run itself. Per variant it prints the final reward
(mean of the last 10% of steps), the gain over the first 10%, mean ESS and mean lag, each as the
median (min-max) over seeds, then each option's final reward minus the default's, paired by seed.
Verdict rule (the issue's): an option helps or hurts only when its seeds' final rewards all lie
outside the default's seed-to-seed range (min-max); otherwise "no measurable effect". A PNG shows
each variant's reward curve against the step (moving average; line = median over seeds, band =
min-max).

    OMP_NUM_THREADS=1 .venv/bin/python bench/lag_compensation.py --tasks reverse,arith --seeds 0,1,2
    .venv/bin/python bench/lag_compensation.py --tasks reverse --steps 150 --variants default,kl-0.1
"""

from __future__ import annotations

import argparse
import json
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

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Each variant: spec edits on top of the job (see `runs.edited`).
VARIANTS: dict[str, dict[str, Any]] = {
    "conventional": {"pipeline__mode": "conventional"},
    "default": {},
    "stale-0.3": {"training__loss__staleWeight": 0.3},
    "kl-0.1": {"training__loss__behaviourKL": 0.1},
    "dc-0.5": {"training__delayCompensation": 0.5},
}
# Each task's example job: the recipe it is documented to learn with.
TASK_JOBS: dict[str, pathlib.Path] = {
    "reverse": ROOT / "examples" / "local-tiny.yaml",
    "arith": ROOT / "examples" / "local-arith.yaml",
}


def _verdict(option: list[float], default: list[float]) -> str:
    lo, hi = min(default), max(default)
    if all(x > hi for x in option):
        return "helps"
    if all(x < lo for x in option):
        return "hurts"
    return "no measurable effect"


Curve = list[tuple[int, float]]  # (step, moving-average reward)


def _plot(curves: dict[str, dict[str, list[Curve]]], out: pathlib.Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(6.5 * len(curves), 4.5), squeeze=False)
    for ax, (task, by_variant) in zip(axes[0], curves.items(), strict=True):
        for variant, seeds in by_variant.items():
            n = min(len(c) for c in seeds)
            steps = [seeds[0][i][0] for i in range(n)]
            at = [[c[i][1] for c in seeds] for i in range(n)]
            (line,) = ax.plot(steps, [statistics.median(v) for v in at], label=variant)
            lows, highs = [min(v) for v in at], [max(v) for v in at]
            ax.fill_between(steps, lows, highs, alpha=0.15, color=line.get_color())
        ax.set_title(f"builtin:{task}: reward, moving average of {window} steps")
        ax.set_xlabel("optimizer step (same samples per step in every variant)")
        ax.set_ylabel("reward (1.0 = every digit right)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--job",
        type=pathlib.Path,
        help="one job for every task (its task.name replaced); default: each task's example",
    )
    ap.add_argument("--tasks", default="reverse", help=f"comma-separated, of {', '.join(TASK_JOBS)}")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default: all)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, help="training.totalSteps of every run (default: the job's own)")
    ap.add_argument("--window", type=int, default=10, help="moving average for the curves, in steps")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "runs" / "lag-compensation")
    args = ap.parse_args()
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)
    tasks, variants = args.tasks.split(","), args.variants.split(",")
    unknown = [t for t in tasks if t not in TASK_JOBS] + [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown task or variant: {', '.join(unknown)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    Runs = list[list[records.StepRecord]]
    results: dict[str, dict[str, Runs]] = {t: {v: [] for v in variants} for t in tasks}
    with tempfile.TemporaryDirectory(prefix="plrl-lagcomp-") as tmp:
        for task in tasks:
            base = yaml.safe_load((args.job or TASK_JOBS[task]).read_text())
            steps = args.steps or base["spec"]["training"]["totalSteps"]
            for i, seed in enumerate(seeds):
                order = variants[i % len(variants) :] + variants[: i % len(variants)]
                for variant in order:
                    doc = runs.edited(
                        base,
                        f"lagcomp-{task}-{variant.replace('.', '')}-s{seed}",
                        training__totalSteps=steps,
                        training__seed=seed,
                        task__seed=seed,
                        task__name=f"builtin:{task}",
                        **VARIANTS[variant],
                    )
                    rows = runs.run_job(doc, pathlib.Path(tmp))
                    results[task][variant].append(rows)
                    print(
                        f"  {task} {variant:<13} seed {seed}: final reward {runs.last_tenth(rows):.3f}, "
                        f"{rows[-1].elapsed_s:.0f} s",
                        flush=True,
                    )

    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    curves: dict[str, dict[str, list[Curve]]] = {}
    for task, by_variant in results.items():
        steps = len(by_variant[variants[0]][0])
        print(f"\nbuiltin:{task}, {steps} steps, seeds {args.seeds}: median (min-max) over seeds")
        print(f"{'variant':<14}{'final reward':<24}{'gain':<24}{'ESS':<22}{'lag':<20}vs default, paired")
        finals = {v: [runs.last_tenth(rows) for rows in rs] for v, rs in by_variant.items()}
        summary[task] = {}
        curves[task] = {}
        for variant, rs in by_variant.items():
            gain = [runs.last_tenth(rows) - runs.first_tenth(rows) for rows in rs]
            ess = [statistics.fmean(r.ess for r in rows) for rows in rs]
            lag = [statistics.fmean(r.lag_mean for r in rows) for rows in rs]
            paired = ""
            if "default" in finals and variant != "default":
                diff = [f - d for f, d in zip(finals[variant], finals["default"], strict=True)]
                paired = f"{stats.fmt_spread(diff, '+.3f')}  {_verdict(finals[variant], finals['default'])}"
            final = stats.fmt_spread(finals[variant], ".3f")
            print(
                f"{variant:<14}{final:<24}{stats.fmt_spread(gain, '+.3f'):<24}"
                f"{stats.fmt_spread(ess, '.3f'):<22}{stats.fmt_spread(lag, '.2f'):<20}{paired}"
            )
            summary[task][variant] = {"final": finals[variant], "gain": gain, "ess": ess, "lag": lag}
            curves[task][variant] = [
                [(r.step, avg) for r, (_, avg) in zip(rows, runs.smoothed(rows, args.window), strict=True)]
                for rows in rs
            ]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    _plot(curves, args.out / "lag-compensation.png", args.window)
    print(f"\nwrote {args.out / 'lag-compensation.png'} and {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
