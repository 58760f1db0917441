"""Run the gpu-check's stages under one deadline and write what comes back from the machine.

Every stage runs as subprocesses in its own process group with a timeout of
min(its cap, time left - the floors of the stages after it); at the timeout the group gets
SIGTERM (so `plrl run` still writes its summary), then SIGKILL. A stage that fails, times out or
raises is recorded and the next one runs. After every stage `results.json`, `summary.txt` and
`logs.txt` are rewritten in the output folder, so a run cut off from outside still leaves what
it measured. The output folder gets only plain files (the GPU machine returns at most 8, no
sub-folders needed): those three, the measured curve and the demo run's report.

Neighbours: `stages.py` (what runs), `results.py` (what is written), `__main__.py` (the CLI).
"""

from __future__ import annotations

import datetime
import os
import pathlib
import signal
import subprocess
import time
import traceback
from collections.abc import Sequence

from scripts.gpu_check.results import Results, StageResult, summary_text
from scripts.gpu_check.stages import Command, Context, Stage

TERM_GRACE_S = 15.0
LOG_TAIL_LINES = 40
LOG_KEEP_LINES = 2000  # per stage in logs.txt
OUT_FILES = ("results.json", "summary.txt", "logs.txt")


def _say(msg: str) -> None:
    print(f"[gpu-check] {msg}", flush=True)


def run_command(cmd: Command, ctx: Context, log: pathlib.Path, timeout_s: float) -> int | None:
    """Exit code, or None if it ran out of time (its whole process group is then ended)."""
    with log.open("a") as logf:
        logf.write(f"\n$ {' '.join(cmd.argv)}\n")
        logf.flush()
        out = (ctx.work / cmd.stdout).open("w") if cmd.stdout else logf
        try:
            proc = subprocess.Popen(
                cmd.argv, cwd=ctx.repo, env=dict(ctx.env), stdout=out, stderr=logf, start_new_session=True
            )
            try:
                return proc.wait(timeout=max(timeout_s, 0.1))
            except subprocess.TimeoutExpired:
                _end_group(proc)
                logf.write(f"\n[gpu-check] killed after {timeout_s:.0f} s\n")
                return None
        finally:
            if out is not logf:
                out.close()


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group this command started, then SIGKILL after a grace period."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_stage(stage: Stage, ctx: Context, timeout_s: float) -> StageResult:
    log = ctx.work / "logs" / f"{stage.name}.log"
    log.parent.mkdir(exist_ok=True)
    t0 = time.monotonic()
    rcs: list[int | None] = []
    timed_out = False
    try:
        if stage.prepare is not None:
            stage.prepare(ctx)
        for cmd in stage.commands(ctx):
            left = timeout_s - (time.monotonic() - t0)
            rc = run_command(cmd, ctx, log, left) if left > 0 else None
            rcs.append(rc)
            if rc is None:
                timed_out = True
                break
        result = stage.collect(ctx, rcs)
    except Exception:
        result = StageResult(stage.name, "failed", "the check itself raised (see log_tail)")
        with log.open("a") as f:
            f.write(traceback.format_exc())
    if timed_out:
        result.status, result.reason = (
            "timeout",
            f"stopped at its {timeout_s:.0f} s limit; {result.reason}".rstrip("; "),
        )
    result.seconds = time.monotonic() - t0
    result.budget_s = round(timeout_s, 1)
    if result.status not in ("passed", "skipped"):
        result.log_tail = _tail(log, LOG_TAIL_LINES)
    return result


def _tail(path: pathlib.Path, lines: int) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def write_outputs(results: Results, ctx: Context, stages: Sequence[Stage]) -> None:
    (ctx.out / "results.json").write_text(results.to_json())
    (ctx.out / "summary.txt").write_text(summary_text(results))
    parts = []
    for s in stages:
        log = ctx.work / "logs" / f"{s.name}.log"
        if log.exists():
            parts.append(f"===== {s.name} =====\n{_tail(log, LOG_KEEP_LINES)}\n")
    (ctx.out / "logs.txt").write_text("".join(parts))


def run_all(ctx: Context, stages: Sequence[Stage], budget_s: float) -> Results:
    start = time.monotonic()
    deadline = start + budget_s
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    results = Results(mode=ctx.mode, started_at=started_at, budget_s=budget_s)
    ctx.out.mkdir(parents=True, exist_ok=True)
    for i, stage in enumerate(stages):
        reserve = sum(s.floor_s for s in stages[i + 1 :])
        left = deadline - time.monotonic() - reserve
        timeout = min(stage.budget_s[ctx.mode], left)
        if timeout < stage.floor_s:
            result = StageResult(
                stage.name,
                "timeout",
                f"not started: {max(left, 0):.0f} s of the budget left, needs {stage.floor_s:.0f}",
            )
        else:
            _say(f"{stage.name}: starting (up to {timeout:.0f} s)")
            result = run_stage(stage, ctx, timeout)
        if stage.name == "env" and result.data:
            results.host = {
                k: v for k, v in result.data.items() if k not in ("import_errors", "absent_but_loaded")
            }
        results.stages.append(result)
        results.wall_s = time.monotonic() - start
        _say(f"{stage.name}: {result.status} in {result.seconds:.1f} s {result.reason}".rstrip())
        write_outputs(results, ctx, stages)
    return results
