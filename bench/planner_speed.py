"""How fast the planner and the simulator answer at N = 1024 (goals: plan < 1 s, 1,000 steps < 1 min).

Run: .venv/bin/python bench/planner_speed.py
Prints wall and CPU seconds for each measurement beside its goal, and goal / wall (above 1 meets
the goal). The machine is shared, so wall time includes waiting for a core; CPU time does not.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from collections.abc import Callable

from plrl_api import utilisation
from plrl_operator.policy import autoscaler, planner, simulator


def timed(fn: Callable[[], object], repeats: int = 1) -> tuple[float, float]:
    """Best (wall, cpu) seconds over `repeats` calls; CPU time counts this process and its children."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), _cpu()
        fn()
        best = min(best, (time.perf_counter() - w0, _cpu() - c0))
    return best


def _cpu() -> float:
    import os

    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def row(what: str, seconds: tuple[float, float], goal: float) -> None:
    wall, cpu = seconds
    print(
        f"{what:66} wall {wall:7.3f} s  cpu {cpu:7.3f} s  goal {goal:3.0f} s  goal/wall {goal / wall:6.1f}x"
    )


def main() -> None:
    curve = utilisation.builtin("h100")
    lengths = planner.Lengths(1024)
    tau = curve.tau or planner.PAPER_TAU
    w = planner.Workload(1024, 1024, lengths, steps_per_round=128, tau=tau)
    row(
        "planner.plan, N=1024, B=1024 (H and I free), in process",
        timed(functools.partial(planner.plan, w, curve), 5),
        1,
    )
    cmd = [sys.executable, "-m", "plrl_operator.cli", "plan", "-N", "1024", "-B", "1024"]
    run = functools.partial(subprocess.run, cmd, check=True, capture_output=True)
    row("`plrl plan -N 1024 -B 1024` (new process, imports included)", timed(run, 3), 1)

    for b in (128, 1024):
        p = planner.plan(planner.Workload(1024, b, lengths, steps_per_round=128, tau=tau), curve).pipeline
        cfg = simulator.SimConfig(1024, b, lengths, curve, tau=tau, steps=1000)
        pipe = functools.partial(simulator.simulate_pipeline, cfg, p.generators, p.concurrency)
        row(
            f"simulate pipeline 1000 steps, N=1024, B={b} (I={p.generators}, H={p.concurrency})",
            timed(pipe),
            60,
        )
        conv = functools.partial(simulator.simulate_conventional, cfg, 128)
        row(f"simulate conventional 1000 steps (R=128), N=1024, B={b}", timed(conv), 60)
        policy = autoscaler.Policy(n_gpus=1024, concurrency=p.concurrency, batch_size=b, lengths=lengths)
        noisy = simulator.SimConfig(1024, b, lengths, curve, tau=tau, steps=1000, rate_noise=0.05)
        auto = functools.partial(simulator.simulate_pipeline, noisy, 341, p.concurrency, policy)
        row(f"simulate autoscaled pipeline 1000 steps from I=341, N=1024, B={b}", timed(auto), 60)


if __name__ == "__main__":
    main()
