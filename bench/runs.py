"""Running whole `plrl run` jobs from a bench script, and reading their reward curves.

`run_job(doc, workdir)` writes the job document (already edited by the caller) to `workdir`, runs
it as a process tree (a Ctrl-C or failure of the bench leaves no worker behind) and returns its
per-step records. The reward helpers are what the learning benches compare: a step's mean reward,
its moving average over elapsed time, and the mean over the first or last 10% of the steps (the
windows `plrl run`'s summary quotes).
"""

from __future__ import annotations

import math
import os
import pathlib
import statistics
import subprocess
import sys
from typing import Any

import yaml

from plrl_api import records
from plrl_operator.local import report
from tests.infra import procs


def run_job(doc: dict[str, Any], workdir: pathlib.Path) -> list[records.StepRecord]:
    """Run the job `doc` with `plrl run --quiet` under `workdir`/<its name>; its step records."""
    name = doc["metadata"]["name"]
    job = workdir / f"{name}.yaml"
    job.write_text(yaml.safe_dump(doc))
    run_dir = workdir / f"run-{name}"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "plrl_operator.cli", "run", str(job), "--run-dir", str(run_dir), "--quiet"]
    procs.run_tree(cmd, timeout=None, check=True, env=env, stdout=subprocess.DEVNULL, stderr=None)
    return report.read_records(run_dir)


def edited(doc: dict[str, Any], name: str, **spec_paths: Any) -> dict[str, Any]:
    """A copy of `doc` named `name`, with each `spec_paths` key (dotted below `spec`, e.g.
    `training__loss__staleWeight` written with double underscores) set to its value."""
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(doc))
    out["metadata"]["name"] = name
    for path, value in spec_paths.items():
        *parents, last = path.split("__")
        node = out["spec"]
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return out


def reward(r: records.StepRecord) -> float:
    return math.nan if r.reward_mean is None else r.reward_mean


def smoothed(rows: list[records.StepRecord], window: int) -> list[tuple[float, float]]:
    """(elapsed s, moving average of the reward over the last `window` steps) per step."""
    out = []
    for i in range(len(rows)):
        chunk = [reward(r) for r in rows[max(0, i - window + 1) : i + 1]]
        out.append((rows[i].elapsed_s, statistics.fmean(chunk)))
    return out


def first_tenth(rows: list[records.StepRecord]) -> float:
    return statistics.fmean(reward(r) for r in rows[: max(1, len(rows) // 10)])


def last_tenth(rows: list[records.StepRecord]) -> float:
    return statistics.fmean(reward(r) for r in rows[-max(1, len(rows) // 10) :])
