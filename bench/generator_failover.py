"""What one generator failure costs a two-generator job, against that generator's share (not a test).

The failover issue's goal: a generator failure costs the job less than the dead generator's own share
of throughput for the outage. Each repeat is one `plrl run` of the chaos soak's job
(bench/jobs/chaos.yaml: 2 generators, 1 s heartbeats, a 4 s timeout) with one fault at `--at-step`:
`kill` (SIGKILL of generator-1) and, with `--kinds kill,stop`, `stop` (SIGSTOP for `--stop-s`, found
by the heartbeat timeout). Kinds alternate within each round. Printed per kind, as median (min-max)
over the repeats: detection, time until the job trained again, throughput lost (steps/s in the 20 s
after the fault vs the 20 s before), and that loss as a fraction of the generator's share (1/2):
below 1.0 meets the goal.

    .venv/bin/python bench/generator_failover.py [--repeats 3] [--kinds kill] [--steps 100] [--at-step 40]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import chaos_soak
from plrl_operator import jobfile
from plrl_operator.local.chaos_report import FaultCost, span


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kinds", default="kill", help="comma-separated: kill, stop")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--at-step", type=int, default=40)
    ap.add_argument("--stop-s", type=float, default=10.0, help="how long a stop lasts")
    ap.add_argument("--out", type=pathlib.Path, default=chaos_soak.ROOT / "runs" / "bench-failover")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in ("kill", "stop") for k in kinds):
        ap.error(f"--kinds: expected kill and/or stop, got {args.kinds!r}")
    generators = jobfile.load_job(chaos_soak.JOB).spec.pipeline.generators
    assert generators is not None, "bench/jobs/chaos.yaml sets pipeline.generators"
    share = 1.0 / generators
    costs: dict[str, list[FaultCost]] = {k: [] for k in kinds}
    failed = 0
    for r in range(args.repeats):
        for kind in kinds:
            fault = f"{kind}:generator-1@step={args.at_step}"
            if kind == "stop":
                fault += f":{args.stop_s:g}s"
            run = chaos_soak.run_chaos(fault, args.steps, args.out / f"{kind}-{r}", quiet=True)
            (c,) = run.costs
            print(
                f"repeat {r + 1} {kind}: exit {run.returncode}, accounted {run.ok}; detection "
                f"{c.detection_s} s, training again after {c.recovery_s} s, lost {c.throughput_lost}",
                flush=True,
            )
            failed += not run.ok
            costs[kind].append(c)
    print(f"\nthe dead generator's share: {share:.0%} (1 of {round(1 / share)} generators)")
    for kind, cs in costs.items():
        detection = [c.detection_s for c in cs if c.detection_s is not None]
        recovery = [c.recovery_s for c in cs if c.recovery_s is not None]
        lost = [c.throughput_lost for c in cs if c.throughput_lost is not None]
        of_share = [x / share for x in lost]
        print(
            f"{kind} generator-1 at step {args.at_step}, {len(cs)} repeats, median (min-max): detection "
            f"{span(detection, '.1f')} s; training again after {span(recovery, '.1f')} s; throughput "
            f"lost (20 s after vs before) {span(lost, '.0%')}; lost / share {span(of_share, '.2f')}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
