"""`python -m scripts.gpu_check`: the driver `scripts/gpu-check.sh` starts (see the package docstring).

    scripts/gpu-check.sh --out DIR            on the GPU machine: every stage, results into DIR
    scripts/gpu-check.sh --cpu --out DIR      anywhere: the same stages, CUDA-only parts skipped
    scripts/gpu-check.sh --dry-run            what would travel to the GPU machine, and its size
    scripts/gpu-check.sh --fetch              download/build the carried wheels into .whl/

Exit code: 0 when every stage passed (or, with --cpu, skipped what needs CUDA), 1 otherwise,
2 for bad usage.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile

from scripts.gpu_check import carry, runner, stages

REPO = pathlib.Path(__file__).resolve().parents[2]
ABSENT_ON_GPU_IMAGE = "kopf,kubernetes,vllm"


def build_parser() -> argparse.ArgumentParser:
    names = ", ".join(s.name for s in stages.STAGES)
    ap = argparse.ArgumentParser(
        prog="scripts/gpu-check.sh", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    ap.add_argument("--cpu", action="store_true", help="run on the CPU, skipping what needs CUDA (CI)")
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "runs" / "gpu-check", help="output folder")
    ap.add_argument("--only", help=f"comma-separated stages to run (of: {names})")
    ap.add_argument("--budget-s", type=float, help="the whole check's deadline (default: 450 GPU, 420 CPU)")
    ap.add_argument("--work", type=pathlib.Path, help="scratch folder (default: a fresh temporary one)")
    ap.add_argument("--keep-work", action="store_true", help="keep the scratch folder (run dirs, logs)")
    ap.add_argument("--dry-run", action="store_true", help="print what would travel and check its size")
    ap.add_argument("--fetch", action="store_true", help="download/build the carried wheels into .whl/")
    return ap


def select(only: str | None) -> list[stages.Stage]:
    if not only:
        return list(stages.STAGES)
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    known = {s.name for s in stages.STAGES}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(
            f"gpu-check: unknown stage(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    # env always runs first: later stages read its probe (the device name, the H100 curve's tau).
    return [s for s in stages.STAGES if s.name in wanted or s.name == "env"]


def child_env(mode: stages.Mode) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths = [str(REPO), str(REPO / "operator"), str(REPO / "workers")]
    if mode == "cpu":
        # The GPU image's missing packages are missing here too (see absent/sitecustomize.py).
        paths.insert(0, str(REPO / "scripts" / "gpu_check" / "absent"))
        env["PLRL_GPU_CHECK_ABSENT"] = ABSENT_ON_GPU_IMAGE
        env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.dry_run:
            return carry.dry_run(REPO)
        if args.fetch:
            return carry.fetch(REPO)
        chosen = select(args.only)
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
            return 2
        return int(stop.code or 0)
    mode: stages.Mode = "cpu" if args.cpu else "gpu"
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix="plrl-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = stages.Context(mode, REPO, work.resolve(), args.out.resolve(), sys.executable, child_env(mode))
    results = runner.run_all(ctx, chosen, args.budget_s or stages.BUDGET_S[mode])
    print((ctx.out / "summary.txt").read_text(), end="")
    print(f"results: {ctx.out / 'results.json'}" + (f"; scratch: {work}" if args.keep_work else ""))
    if not args.keep_work and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if results.ok else 1


if __name__ == "__main__":
    sys.exit(main())
