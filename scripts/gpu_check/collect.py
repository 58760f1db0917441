"""Turn what a gpu-check stage left behind into checks and data (pure: documents in, results out).

Each function takes the stage's outputs already read (JSON documents, JUnit XML text) and the
mode, and returns a `StageResult` whose status follows from its checks. What is judged differs by
mode: on the GPU every CUDA test must run and pass, the measured plan must be usable and the demo
run must learn; on the CPU the CUDA tests may only skip, and learning over a handful of steps is
recorded but not judged.

Neighbours: `stages.py` (reads the files and calls these), `results.py` (the result types).
"""

from __future__ import annotations

import itertools
import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from scripts.gpu_check.results import Check, StageResult, judged

Mode = Literal["gpu", "cpu"]
# The paper's worked example that `plrl plan` reproduces with the built-in H100 curve.
PAPER_PLAN = {"generators": 44, "concurrency": 192, "speedup": 1.57}
MISSED_BROADCAST = "missing from epoch"  # weight_sync/sender.py's warning for a member that did not join
PLAN_FIELDS = (
    "n_gpus",
    "batch_size",
    "curve",
    "tau",
    "r_conv",
    "generators",
    "concurrency",
    "utilisation",
    "r_pipeline",
    "g_max",
    "bottleneck",
    "speedup",
)


# ------------------------------------------------------------------ env


def env_result(probe: Mapping[str, Any] | None, mode: Mode, install_rc: str | None) -> StageResult:
    if probe is None:
        return StageResult("env", "failed", "the probe wrote nothing (see the log)")
    errors = probe.get("import_errors", {})
    checks = [
        Check("modules import", not errors, "; ".join(f"{m}: {e}" for m, e in errors.items()) or "all"),
        Check(
            "no kopf/kubernetes/vllm needed",
            not probe.get("absent_but_loaded"),
            ", ".join(probe.get("absent_but_loaded", [])) or "none loaded",
        ),
    ]
    device = probe.get("device")
    if mode == "gpu":
        checks.append(Check("CUDA device", device is not None, device or "torch sees no CUDA device"))
        checks.append(
            Check("carried wheels installed", install_rc == "0", f"pip install exit code {install_rc}")
        )
    else:
        checks.append(Check("CUDA device", None, device or "none (--cpu)"))
    return judged("env", checks, dict(probe))


# ------------------------------------------------------------------ pytest


def junit_counts(xml_texts: Sequence[str | None]) -> dict[str, Any]:
    """Pass/fail/skip counts, failed test ids and skip reasons over several JUnit XML reports."""
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "reports_missing": 0}
    failures: list[str] = []
    skips: dict[str, int] = {}
    for text in xml_texts:
        if text is None:
            counts["reports_missing"] += 1
            continue
        for case in ET.fromstring(text).iter("testcase"):
            test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
            outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
            if outcome is None:
                counts["passed"] += 1
            elif outcome.tag == "skipped":
                counts["skipped"] += 1
                reason = (outcome.get("message") or "").removeprefix("Skipped: ").strip()
                skips[reason] = skips.get(reason, 0) + 1
            else:
                counts["failed"] += 1
                failures.append(f"{test_id}: {(outcome.get('message') or '').splitlines()[0][:200]}")
    counts["failures"] = failures
    counts["skip_reasons"] = skips
    return counts


def tests_result(name: str, counts: Mapping[str, Any], rcs: Sequence[int | None], mode: Mode) -> StageResult:
    """On the GPU the tests must run and pass; on the CPU they may only skip (or pass)."""
    data = dict(counts)
    ran = counts["passed"] + counts["failed"]
    if counts["failed"]:
        return StageResult(name, "failed", f"{counts['failed']} failed: {counts['failures'][0]}", data=data)
    if counts["reports_missing"] or any(rc not in (0, None) for rc in rcs):
        return StageResult(name, "failed", f"pytest exit codes {list(rcs)} (see the log)", data=data)
    reasons = "; ".join(sorted(counts["skip_reasons"])) or "none collected"
    if not ran:
        if mode == "cpu" and counts["skipped"]:
            return StageResult(name, "skipped", f"needs CUDA (--cpu): {reasons}", data=data)
        return StageResult(name, "failed", f"no test ran: {reasons}", data=data)
    return StageResult(name, "passed", data=data)


# ------------------------------------------------------------------ profile and plan


def curve_result(
    curve: Mapping[str, Any] | None, reference: Mapping[str, Any], mode: Mode, file: str
) -> StageResult:
    """The measured curve has every field of the built-in one and is a valid U(h) table."""
    if curve is None:
        return StageResult("profile", "failed", "plrl profile wrote no curve (see the log)")
    missing = sorted(set(reference) - set(curve))
    points = curve.get("points") or []
    hs = [p[0] for p in points]
    us = [p[1] for p in points]
    valid = (
        len(points) >= 3
        and all(b > a for a, b in itertools.pairwise(hs))
        and all(b >= a for a, b in itertools.pairwise(us))
        and all(0 < u <= 1 for u in us)
    )
    checks = [
        Check(
            "fields of the built-in curve", not missing, f"missing {missing}" if missing else "all present"
        ),
        Check("a non-decreasing U(h) in (0, 1]", valid, f"{len(points)} points"),
    ]
    if mode == "gpu":
        checks.append(Check("bf16 products", curve.get("dtype") == "bfloat16", str(curve.get("dtype"))))
    data = {
        k: curve.get(k) for k in ("name", "device", "dtype", "peak_tflops", "peak_source", "tau", "points")
    }
    return judged("profile", checks, data | {"file": file})


def pick_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `plrl plan --json` the summary compares side by side."""
    flat = {**plan, **plan.get("conventional", {}), **plan.get("pipeline", {})}
    return {k: flat.get(k) for k in PLAN_FIELDS}


def plan_result(
    h100: Mapping[str, Any] | None, measured: Mapping[str, Any] | None, measured_name: str
) -> StageResult:
    checks = []
    data: dict[str, Any] = {}
    if h100 is None:
        checks.append(Check("plan with the H100 curve", False, "plrl plan printed no JSON"))
    else:
        a = data["h100"] = pick_plan(h100)
        same = (
            a["generators"] == PAPER_PLAN["generators"]
            and a["concurrency"] == PAPER_PLAN["concurrency"]
            and abs(a["speedup"] - PAPER_PLAN["speedup"]) < 0.01
        )
        checks.append(
            Check(
                "H100 plan is the paper's",
                same,
                f"I={a['generators']}, H={a['concurrency']}, {a['speedup']:.2f}x",
            )
        )
    if measured is None:
        checks.append(Check("plan with the measured curve", False, "no measured curve or no JSON"))
    else:
        b = data["measured"] = pick_plan(measured)
        usable = (
            b["curve"] == measured_name
            and 0 < b["generators"] < b["n_gpus"]
            and math.isfinite(b["speedup"])
            and b["speedup"] > 0
        )
        checks.append(
            Check(
                "plan with the measured curve",
                usable,
                f"curve {b['curve']}: I={b['generators']}, H={b['concurrency']}, {b['speedup']:.2f}x",
            )
        )
    return judged("plan", checks, data)


# ------------------------------------------------------------------ bench


def bench_result(doc: Mapping[str, Any] | None, hs: Sequence[int]) -> StageResult:
    if doc is None:
        return StageResult("bench-decode", "failed", "the bench wrote no results (see the log)")
    rows = doc.get("rows", [])
    got = [r["h"] for r in rows]
    sane = all(math.isfinite(r["ratio"]) and r["ratio"] > 0 for r in rows)
    checks = [
        Check("every H measured", got == list(hs), f"H = {got}"),
        Check("finite tokens/s", sane, ", ".join(f"H={r['h']}: {r['ratio']:.2f}x" for r in rows)),
    ]
    return judged("bench-decode", checks, dict(doc))


# ------------------------------------------------------------------ run-demo


def run_result(
    summary: Mapping[str, Any] | None,
    job: Mapping[str, Any],
    rc: int | None,
    judge_learning: bool,
    min_gain: float,
    trainer_log: str | None = None,
) -> StageResult:
    """The demo run finished its steps, trained every prompt once, took weights in flight, learned.

    `trainer_log`: trainer rank 0's log, where a broadcast that missed the generator is logged."""
    if summary is None:
        return StageResult(
            "run-demo", "failed", f"plrl run wrote no summary (exit code {rc})", data={"job": dict(job)}
        )
    steps, total = summary.get("steps", 0), job["total_steps"]
    p = summary.get("prompts", {})
    first, last = summary.get("reward_first_10pct", math.nan), summary.get("reward_last_10pct", math.nan)
    mixed = summary.get("mixed_version_samples", 0)
    gain = last - first
    checks = [
        Check("finished", rc == 0 and steps == total, f"exit code {rc}, {steps} of {total} steps"),
        Check(
            "every prompt trained once",
            bool(p) and p.get("issued") == p.get("trained", 0) + p.get("dropped_by_lag", 0),
            ", ".join(f"{k} {v}" for k, v in p.items() if k in ("issued", "trained", "dropped_by_lag")),
        ),
        Check(
            "every broadcast reached the generator",
            trainer_log is not None and MISSED_BROADCAST not in trainer_log,
            "no log" if trainer_log is None else f"{trainer_log.count(MISSED_BROADCAST)} missed",
        ),
        Check(
            "updates land in flight",
            mixed > 0 if judge_learning else None,
            f"{mixed} samples hold tokens of 2+ weight versions, "
            f"lag mean {summary.get('lag_mean', math.nan):.2f}",
        ),
        Check(
            "learns",
            (gain >= min_gain) if judge_learning else None,
            f"reward {first:.3f} -> {last:.3f} (first vs last 10% of steps; needs +{min_gain})"
            + ("" if judge_learning else f"; not judged over {total} steps"),
        ),
    ]
    return judged("run-demo", checks, {"summary": dict(summary), "job": dict(job)})
