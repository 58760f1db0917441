"""How fast the planner and the simulator answer at N = 1024 (goals: plan < 1 s, 1,000 steps < 1 min).

Run: .venv/bin/python bench/planner_speed.py [--repeats 3]
Each measurement is timed `--repeats` times; it prints wall seconds as the median (min-max), the
median CPU seconds, its goal, and goal / median wall (above 1 meets the goal). The machine is shared,
so wall time includes waiting for a core; CPU time does not.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from plrl_api import utilisation
from plrl_operator.policy import autoscaler, planner, simulator

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench import stats

Timings = list[tuple[float, float]]


def timed(fn: Callable[[], object], repeats: int) -> Timings:
    """(wall, cpu) seconds of each of `repeats` calls; CPU time counts this process and its children."""
    out = []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), _cpu()
        fn()
        out.append((time.perf_counter() - w0, _cpu() - c0))
    return out


def _cpu() -> float:
    import os

    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def row(what: str, timings: Timings, goal: float) -> None:
    walls = [w for w, _ in timings]
    wall, cpu = statistics.median(walls), statistics.median(c for _, c in timings)
    print(
        f"{what:66} wall {stats.fmt_spread(walls, '.3f')} s  cpu {cpu:7.3f} s  goal {goal:3.0f} s  "
        f"goal/wall {goal / wall:6.1f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    n = args.repeats
    curve = utilisation.builtin("h100")
    lengths = planner.Lengths(1024)
    tau = curve.tau or planner.PAPER_TAU
    w = planner.Workload(1024, 1024, lengths, steps_per_round=128, tau=tau)
    row(
        "planner.plan, N=1024, B=1024 (H and I free), in process",
        timed(functools.partial(planner.plan, w, curve), n),
        1,
    )
    cmd = [sys.executable, "-m", "plrl_operator.cli", "plan", "-N", "1024", "-B", "1024"]
    run = functools.partial(subprocess.run, cmd, check=True, capture_output=True)
    row("`plrl plan -N 1024 -B 1024` (new process, imports included)", timed(run, n), 1)

    for b in (128, 1024):
        p = planner.plan(planner.Workload(1024, b, lengths, steps_per_round=128, tau=tau), curve).pipeline
        cfg = simulator.SimConfig(1024, b, lengths, curve, tau=tau, steps=1000)
        pipe = functools.partial(simulator.simulate_pipeline, cfg, p.generators, p.concurrency)
        row(
            f"simulate pipeline 1000 steps, N=1024, B={b} (I={p.generators}, H={p.concurrency})",
            timed(pipe, n),
            60,
        )
        conv = functools.partial(simulator.simulate_conventional, cfg, 128)
        row(f"simulate conventional 1000 steps (R=128), N=1024, B={b}", timed(conv, n), 60)
        policy = autoscaler.Policy(n_gpus=1024, concurrency=p.concurrency, batch_size=b, lengths=lengths)
        noisy = simulator.SimConfig(1024, b, lengths, curve, tau=tau, steps=1000, rate_noise=0.05)
        auto = functools.partial(simulator.simulate_pipeline, noisy, 341, p.concurrency, policy)
        row(f"simulate autoscaled pipeline 1000 steps from I=341, N=1024, B={b}", timed(auto, n), 60)


if __name__ == "__main__":
    main()
