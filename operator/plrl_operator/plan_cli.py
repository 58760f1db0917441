"""`plrl plan`: the throughput model's answer for a job file or a cluster size, as a table or JSON.

Without a job file the defaults are the paper's worked example (N = 128, B = 128, R = 128
optimizer steps per conventional round, L = 1024, built-in H100 curve), so `plrl plan` alone
reproduces it. With a job file, N, B, L, H, the lag limit, pod sizes and autoscale bounds come from
its spec, and conventional RL is taken as this project's conventional mode (one optimizer step per
round, R = 1); flags override both. Bad input prints one line, `plrl plan: error: ...`, and exits
with code 2. (The paper calls R "G"; here G is the job's `samplesPerPrompt`, as in the spec.)

Neighbours: `policy.planner` (the model), `plrl_api.utilisation` (curves), `jobfile.load_job`,
`plrl_operator.cli` (dispatches the verb here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, NoReturn

from plrl_api import utilisation
from plrl_operator import jobfile
from plrl_operator.policy import planner, types

if TYPE_CHECKING:
    from plrl_api import spec as spec_mod

PAPER = {"gpus": 128, "batch_size": 128, "steps_per_round": 128, "max_len": 1024}
PAPER_SPEEDUP = 1.57


class UsageError(Exception):
    """Bad command-line input; printed as one line."""


class Parser(argparse.ArgumentParser):
    """argparse that reports errors as an exception instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _lag(text: str) -> int | None:
    if text.lower() in ("none", "unlimited"):
        return None
    return int(text)


def _concurrency(text: str) -> int | None:
    return None if text.lower() == "auto" else int(text)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Flags shared with `plrl simulate`."""
    p.add_argument("--batch-size", "-B", type=int, help="B: sequences per optimizer step")
    p.add_argument("--max-len", "-L", type=int, help="L: most tokens per sequence")
    p.add_argument(
        "--lengths", choices=("uniform", "fixed"), help="length distribution on [1, L] (default uniform)"
    )
    p.add_argument(
        "--steps-per-round",
        "-R",
        type=int,
        help="R: optimizer steps per conventional round (S = B * R sequences generated per round)",
    )
    p.add_argument(
        "--curve", help="utilisation curve: a built-in name (h100) or a JSON file from plrl profile"
    )
    p.add_argument("--tau", type=float, help="training flashes per token (default: the curve's, else 4.92)")
    p.add_argument("--gpus-per-generator", type=int, help="GPUs per generator pod")
    p.add_argument("--gpus-per-trainer", type=int, help="GPUs per trainer pod")
    # SUPPRESS: absent unless given, because 'none' and 'auto' are values that override a job's.
    p.add_argument(
        "--max-lag", type=_lag, default=argparse.SUPPRESS, help="largest allowed g_max in steps, or 'none'"
    )
    p.add_argument(
        "--concurrency",
        "-H",
        type=_concurrency,
        default=argparse.SUPPRESS,
        help="H: fix sequences per generator, or 'auto' to choose it",
    )


def build_parser() -> Parser:
    p = Parser(prog="plrl plan", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("job", nargs="?", help="a PipelineRLJob YAML file (optional)")
    p.add_argument("--gpus", "-N", type=int, help="N: accelerators in the job")
    p.add_argument("--generators", "-I", type=int, help="I: fix the generator GPUs instead of choosing them")
    add_model_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def load_curve(ref: str | None) -> utilisation.Curve:
    return utilisation.load(ref) if ref else utilisation.builtin()


def load_job(path: str) -> spec_mod.JobSpec:
    """The job file's spec; imported here so that plans without a job skip building the spec models."""
    from plrl_api import spec as spec_mod

    try:
        return jobfile.load_job(path).spec
    except spec_mod.JobFileError as err:
        raise UsageError(str(err)) from None


def workload_from_args(args: argparse.Namespace, curve: utilisation.Curve) -> planner.Workload:
    """The model inputs: the job file's (or the paper's), overridden by any flag given."""
    if args.job:
        job = load_job(args.job)
        w = planner.workload_for_job(job, curve, fixed_generators=True)
    else:
        tau = curve.tau if curve.tau is not None else planner.PAPER_TAU
        w = planner.Workload(
            n_gpus=PAPER["gpus"],
            batch_size=PAPER["batch_size"],
            lengths=planner.Lengths(PAPER["max_len"]),
            steps_per_round=PAPER["steps_per_round"],
            tau=tau,
        )
    if args.lengths is not None or args.max_len is not None:
        kind = args.lengths or w.lengths.kind
        w = dataclasses.replace(w, lengths=planner.Lengths(args.max_len or w.lengths.max_len, kind))
    overrides = {
        "n_gpus": getattr(args, "gpus", None),
        "batch_size": args.batch_size,
        "steps_per_round": args.steps_per_round,
        "tau": args.tau,
        "gpus_per_generator": args.gpus_per_generator,
        "gpus_per_trainer": args.gpus_per_trainer,
        "generators": getattr(args, "generators", None),
    }
    w = dataclasses.replace(w, **{k: v for k, v in overrides.items() if v is not None})
    if hasattr(args, "max_lag"):
        w = dataclasses.replace(w, max_lag=args.max_lag)
    if hasattr(args, "concurrency"):
        w = dataclasses.replace(w, concurrency=args.concurrency)
    return w


def format_plan(p: types.Plan, curve: utilisation.Curve | None = None) -> str:
    c, q = p.conventional, p.pipeline
    s_per_gpu = p.batch_size * c.steps_per_round / p.n_gpus
    lag_limit = "none" if p.max_lag_limit is None else str(p.max_lag_limit)
    rows = [
        (
            "generators I",
            "-",
            f"{q.generators}",
            f"{q.generators / p.n_gpus:.0%} of N; balance point {p.balance_generators:.1f}",
        ),
        ("trainers N-I", "-", f"{p.trainers}", ""),
        (
            "batch per generator",
            f"S/N = {s_per_gpu:.4g}",
            f"H = {q.concurrency}",
            f"U(H) = {q.utilisation:.3f}",
        ),
        ("r_gen", f"{c.r_gen:.2f}", f"{q.r_gen:.2f}", "tokens per flash"),
        ("r_train", f"{c.r_train:.2f}", f"{q.r_train:.2f}", ""),
        ("throughput", f"{c.r_conv:.2f}", f"{q.r_pipeline:.2f}", f"pipeline bottleneck: {q.bottleneck}"),
        (
            "max lag (steps)",
            f"{c.max_lag}",
            f"{q.g_max}",
            f"H*I*L/(Lbar*B) = {q.lag_steps:.2f}, limit {lag_limit}",
        ),
        ("speed-up", "", f"{p.speedup:.2f}x", ""),
    ]
    head = (
        f"N={p.n_gpus} accelerators, B={p.batch_size} samples per optimizer step, "
        f"R={c.steps_per_round} steps per conventional round,\n"
        f"L={p.max_len} tokens at most (mean {p.mean_len:g}), tau={p.tau:.3f} flashes per trained token, "
        f"curve {p.curve}"
    )
    guide = (
        "Rates are tokens per flash (a flash: one token's forward pass at peak FLOP/s, so they\n"
        "compare across devices); speed-up = pipeline throughput / conventional throughput."
    )
    lines = [head, guide, "", f"{'':22}{'conventional':>14}{'pipeline':>12}"]
    lines += [f"{a:22}{b:>14}{c_:>12}  {d}".rstrip() for a, b, c_, d in rows]
    gpg = q.generators // p.generator_pods if p.generator_pods else 0
    gpt = p.trainers // p.trainer_pods if p.trainer_pods else 0
    lines += [
        "",
        f"pods: {p.generator_pods} generator pods x {gpg} GPU, {p.trainer_pods} trainer pods x {gpt} GPU",
    ]
    if curve is not None and p.speedup > 2 * PAPER_SPEEDUP:
        # Far above the paper's figure: say which input makes it so, so a user can judge it.
        lines.append(
            f"why {p.speedup:.2f}x and not the paper's {PAPER_SPEEDUP}x (N=128, B=128, R=128): conventional "
            f"RL decodes only S/N = {s_per_gpu:.4g}\nsequences per accelerator here, at "
            f"U = {curve.u(s_per_gpu):.3f} of peak, while each generator runs H = {q.concurrency} at "
            f"U = {q.utilisation:.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
        curve = load_curve(args.curve)
        w = workload_from_args(args, curve)
        result = planner.plan(w, curve)
    except SystemExit as done:  # --help
        return int(done.code or 0)
    except (UsageError, planner.PlanError, utilisation.CurveError) as err:
        print(f"plrl plan: error: {_one_line(err)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_plan(result, curve))
    return 0


def _one_line(err: Exception) -> str:
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip())
