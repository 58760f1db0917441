"""`plrl simulate`: simulated against modelled throughput over cluster sizes, and the autoscaler at work.

For each N it plans (H, I) with the model, then simulates conventional RL and the fixed-I
pipeline (`policy.simulator`), and prints both beside the closed forms. It then runs the
autoscaled pipeline at one N from the seed's initial I and shows how I moved. A PNG shows
throughput against N and I over time. Defaults are the paper's worked example (B = 128,
R = 128 steps per round, L = 1024, H100 curve); a job file supplies B, L, H, the lag limit and
autoscale settings.

Neighbours: `policy.simulator`, `policy.planner`, `plan_cli` (shared flags), `plrl_workers.cli`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from typing import TYPE_CHECKING, Any

from plrl_api import utilisation
from plrl_operator import plan_cli
from plrl_operator.policy import autoscaler, planner, simulator

if TYPE_CHECKING:
    from plrl_api import spec as spec_mod

DEFAULT_NS = "8,16,32,64,128,256,512,1024"


def _ns(text: str) -> list[int]:
    try:
        ns = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU counts, got {text!r}") from None
    if not ns:
        raise argparse.ArgumentTypeError("expected at least one GPU count")
    return ns


def build_parser() -> plan_cli.Parser:
    p = plan_cli.Parser(prog="plrl simulate", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("job", nargs="?", help="a PipelineRLJob YAML file (optional)")
    p.add_argument("--gpus", "-N", type=_ns, default=None, help=f"cluster sizes (default {DEFAULT_NS})")
    plan_cli.add_model_args(p)
    p.add_argument("--steps", type=int, default=400, help="optimizer steps simulated per run")
    p.add_argument("--seed", type=int, default=0, help="seed for sequence lengths and rate noise")
    p.add_argument("--broadcast-flashes", type=float, default=0.0, help="weight broadcast pause per step")
    p.add_argument("--noise", type=float, default=0.05, help="relative noise on rates the autoscaler sees")
    p.add_argument(
        "--autoscale-gpus", type=int, help="N for the autoscaled run (default 128 or the largest N)"
    )
    p.add_argument("--autoscale-steps", type=int, default=800, help="optimizer steps of the autoscaled run")
    p.add_argument(
        "--autoscale-start", type=int, help="initial I of the autoscaled run (default: the seed's rule)"
    )
    p.add_argument(
        "--png",
        default="runs/plrl-simulate.png",
        help="where to write the plot ('' for none; runs/ is git-ignored)",
    )
    p.add_argument("--json", action="store_true", help="print results as JSON")
    return p


def _check(args: argparse.Namespace, ns: list[int]) -> None:
    if any(n <= 0 for n in ns):
        raise planner.PlanError(f"GPU counts must be positive, got {ns}")
    if args.steps <= 0 or args.autoscale_steps <= 0:
        raise planner.PlanError("--steps and --autoscale-steps must be positive")
    if not 0 <= args.noise < 1:
        raise planner.PlanError(f"--noise={args.noise} must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class Result:
    rows: list[simulator.SweepRow]
    autoscaled: simulator.SimResult
    workload: planner.Workload
    """The autoscaled run's workload."""
    curve: utilisation.Curve


def run(args: argparse.Namespace) -> Result:
    curve = plan_cli.load_curve(args.curve)
    ns = args.gpus or _ns(DEFAULT_NS)
    job = plan_cli.load_job(args.job) if args.job else None
    if job is not None and args.gpus is None:
        ns = [job.resources.total_gpus]
    _check(args, ns)
    workloads = [_workload(args, curve, n) for n in ns]
    cfg = simulator.SimConfig(
        n_gpus=ns[0],
        batch_size=workloads[0].batch_size,
        lengths=workloads[0].lengths,
        curve=curve,
        steps=args.steps,
        seed=args.seed,
        broadcast_flashes=args.broadcast_flashes,
        rate_noise=args.noise,
    )
    rows = simulator.sweep(workloads, curve, cfg)
    n_auto = args.autoscale_gpus or (128 if 128 in ns else ns[-1])
    w_auto = _workload(args, curve, n_auto)
    auto = _autoscaled(w_auto, curve, cfg, args, job)
    return Result(rows, auto, w_auto, curve)


def _workload(args: argparse.Namespace, curve: utilisation.Curve, n: int) -> planner.Workload:
    ns = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "gpus"})
    ns.gpus, ns.generators = n, None
    # the sweep lets the planner choose I at every N, even when the job file fixes it
    return dataclasses.replace(plan_cli.workload_from_args(ns, curve), generators=None)


def _autoscaled(
    w: planner.Workload,
    curve: utilisation.Curve,
    cfg: simulator.SimConfig,
    args: argparse.Namespace,
    job: spec_mod.JobSpec | None,
) -> simulator.SimResult:
    h = w.concurrency or planner.plan(w, curve).pipeline.concurrency
    base = autoscaler.policy_for_job(job) if job is not None else autoscaler.Policy(n_gpus=w.n_gpus)
    policy = dataclasses.replace(
        base,
        rate_unit="tokens/flash",
        n_gpus=w.n_gpus,
        gpus_per_generator=w.gpus_per_generator,
        gpus_per_trainer=w.gpus_per_trainer,
        concurrency=h,
        batch_size=w.batch_size,
        lengths=w.lengths,
        max_lag=w.max_lag,
        max_generators=base.max_generators if job is not None and base.n_gpus == w.n_gpus else None,
    )
    start = args.autoscale_start or planner.seed_generators(dataclasses.replace(w, concurrency=h))
    c = dataclasses.replace(
        cfg,
        n_gpus=w.n_gpus,
        batch_size=w.batch_size,
        lengths=w.lengths,
        tau=w.tau,
        steps=args.autoscale_steps,
    )
    return simulator.simulate_pipeline(c, start, h, policy)


def format_table(result: Result) -> str:
    rows = result.rows
    head = f"{'N':>5} {'I':>5} {'H':>5} | {'conv model':>10} {'sim':>7} | {'pipe model':>10} {'sim':>7}"
    head += f" | {'speed-up model':>14} {'sim':>5} | {'lag model':>9} {'sim':>5}"
    lines = ["throughput in tokens per flash (simulated: after warm-up; conventional: whole rounds)", head]
    for r in rows:
        p = r.plan
        lines.append(
            f"{p.n_gpus:>5} {p.pipeline.generators:>5} {p.pipeline.concurrency:>5} | "
            f"{p.conventional.r_conv:>10.2f} {r.conventional.throughput:>7.2f} | "
            f"{p.pipeline.r_pipeline:>10.2f} {r.pipeline.throughput:>7.2f} | "
            f"{p.speedup:>13.2f}x {r.speedup:>4.2f}x | {p.pipeline.g_max:>9} {r.pipeline.max_lag:>5}"
        )
    auto = result.autoscaled
    gens = auto.generators
    lines += [
        "",
        f"autoscaled pipeline at N={auto.n_gpus}: I {gens[0]} -> {gens[-1]} in {len(auto.decisions)} "
        f"changes, throughput {auto.throughput:.2f} tokens/flash after warm-up, "
        f"{auto.lost_tokens} tokens lost to removals",
    ]
    lines += [f"  step {d.step}: {d.reason}" for d in auto.decisions[:12]]
    if len(auto.decisions) > 12:
        lines.append(f"  ... {len(auto.decisions) - 12} more changes")
    return "\n".join(lines)


def to_json(result: Result) -> dict[str, Any]:
    rows, auto = result.rows, result.autoscaled
    return {
        "rows": [
            {
                "plan": r.plan.to_dict(),
                "conventional_sim": r.conventional.throughput,
                "pipeline_sim": r.pipeline.throughput,
                "pipeline_sim_max_lag": r.pipeline.max_lag,
                "speedup_sim": r.speedup,
            }
            for r in rows
        ],
        "autoscaled": {
            "n_gpus": auto.n_gpus,
            "throughput": auto.throughput,
            "generators": list(auto.generators),
            "decisions": [d.to_dict() for d in auto.decisions],
            "lost_tokens": auto.lost_tokens,
        },
    }


def plot(result: Result, path: pathlib.Path) -> None:
    import matplotlib  # lazy: only this verb needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, auto = result.rows, result.autoscaled
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ns = [r.plan.n_gpus for r in rows]
    ax1.plot(ns, [r.plan.conventional.r_conv for r in rows], "--", color="C0", label="conventional (model)")
    ax1.plot(ns, [r.conventional.throughput for r in rows], "o", color="C0", label="conventional (simulated)")
    ax1.plot(ns, [r.plan.pipeline.r_pipeline for r in rows], "--", color="C1", label="pipeline (model)")
    ax1.plot(ns, [r.pipeline.throughput for r in rows], "s", color="C1", label="pipeline (simulated)")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("accelerators N")
    ax1.set_ylabel("trained tokens per flash")
    ax1.set_title("throughput vs N")
    ax1.legend()
    steps = [r.step for r in auto.records]
    ax2.step(steps, list(auto.generators), where="post", color="C2", label="I (autoscaled)")
    best = planner.plan(dataclasses.replace(result.workload, generators=None), result.curve)
    ax2.axhline(
        best.pipeline.generators, ls=":", color="grey", label=f"planner's I = {best.pipeline.generators}"
    )
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("generator GPUs I")
    ax2.set_title(f"autoscaler at N={auto.n_gpus}")
    ax2.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
        result = run(args)
    except SystemExit as done:  # --help
        return int(done.code or 0)
    except (plan_cli.UsageError, planner.PlanError, utilisation.CurveError) as err:
        print(f"plrl simulate: error: {plan_cli._one_line(err)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_json(result), indent=2))
    else:
        print(format_table(result))
    if args.png:
        plot(result, pathlib.Path(args.png))
        if not args.json:
            print(f"\nplot written to {args.png}")
    return 0
