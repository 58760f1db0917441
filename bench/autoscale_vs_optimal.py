"""Autoscaled I against the planner's best fixed I, simulated (goal: ratio >= 0.95).

Run: .venv/bin/python bench/autoscale_vs_optimal.py [--gpus 128,1024] [--seeds 3] [--noise 0.05]

For each N the planner picks (H, I*) for the paper's workload (B = 128, L = 1024, built-in H100
curve). Two runs of the discrete-event simulator share a seed: the pipeline fixed at I*, and the
autoscaled pipeline started from the seed's initial I = N // 3 with the default autoscale
settings, its rates jittered by `--noise`. Throughput is trained tokens per flash after the first
third of the run (a pipeline needs about g_max steps to fill, so runs last 3 g_max steps). Prints
each seed's ratio, then the median with its min-max. Simulated time, not wall time: the numbers
do not depend on the machine.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import stats
from plrl_api import utilisation
from plrl_operator.policy import autoscaler, planner, simulator


def compare(n: int, seed: int, noise: float) -> tuple[float, simulator.SimResult, simulator.SimResult]:
    curve = utilisation.builtin("h100")
    lengths = planner.Lengths(1024)
    plan = planner.plan(planner.Workload(n, 128, lengths), curve).pipeline
    steps = max(600, 3 * plan.g_max)
    cfg = simulator.SimConfig(
        n_gpus=n, batch_size=128, lengths=lengths, curve=curve, steps=steps, seed=seed, rate_noise=noise
    )
    fixed = simulator.simulate_pipeline(cfg, plan.generators, plan.concurrency)
    policy = autoscaler.Policy(n_gpus=n, rate_unit="tokens/flash")
    auto = simulator.simulate_pipeline(cfg, n // 3, plan.concurrency, policy)
    return auto.throughput / fixed.throughput, fixed, auto


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--gpus", default="128,1024", help="comma-separated cluster sizes")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per size (the median is the headline)")
    ap.add_argument(
        "--noise", type=float, default=0.05, help="relative noise on the rates the autoscaler sees"
    )
    args = ap.parse_args()
    for n in (int(x) for x in args.gpus.split(",")):
        ratios = []
        for seed in range(args.seeds):
            ratio, fixed, auto = compare(n, seed, args.noise)
            ratios.append(ratio)
            moves = " -> ".join(str(d.generators) for d in auto.decisions)
            print(
                f"N={n:5} seed {seed}: fixed I={fixed.generators[0]} {fixed.throughput:8.3f} tok/flash | "
                f"autoscaled I={n // 3} -> {moves or 'no change'} {auto.throughput:8.3f} tok/flash "
                f"| ratio {ratio:.3f}"
            )
        med, lo, hi = stats.median_spread(ratios)
        print(
            f"N={n:5}: autoscaled / best fixed = {med:.3f} "
            f"(min {lo:.3f}, max {hi:.3f}, {len(ratios)} seeds; goal >= 0.95)"
        )


if __name__ == "__main__":
    main()
