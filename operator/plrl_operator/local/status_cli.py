"""`plrl status RUN_DIR`: where a local run stands (also while it runs), from its step records.

Neighbours: `local.report` (reads and summarises them), `local.runner` (writes the run directory).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from plrl_api import spec
from plrl_operator import jobfile
from plrl_operator.local import report


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="plrl status", description="Show the progress of a local run directory."
    )
    ap.add_argument("run_dir", type=pathlib.Path, help="the --run-dir of `plrl run` (default runs/<job>)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    job_file = args.run_dir / "job.yaml"
    if not job_file.exists():
        print(f"plrl status: {args.run_dir} is not a plrl run directory (no job.yaml)", file=sys.stderr)
        return 2
    try:
        job = jobfile.load_job(job_file)
    except spec.JobFileError as err:
        print(f"plrl status: {err}", file=sys.stderr)
        return 2
    rows = report.read_records(args.run_dir)
    summary = report.summarize(rows, total_steps=job.spec.training.total_steps)
    if args.json:
        print(summary.model_dump_json(indent=2))
        return 0
    print(f"job {job.metadata.name} ({job.spec.pipeline.mode.value}), run directory {args.run_dir}")
    if rows:
        print(report.progress_line(rows[-1], job.spec.training.total_steps))
    print(report.summary_text(summary))
    return 0
