"""The gpu-check's logic, without running a check: what travels, how stages are judged and run.

Cases: pins parse (sdist marked, bad lines refused) and agree with the lock; missing, doubled and
unpinned wheels are named; what travels is tracked + untracked-not-ignored + .whl/ and nothing
else ignored, and a tree over 64 MiB fails the dry run; the `--cpu` guard makes kopf/kubernetes
absent in child processes; JUnit reports become counts, and all-skipped is a skip on the CPU but
a failure on the GPU; the measured curve must have the built-in curve's fields; the plan stage
knows the paper's numbers; the demo run is judged on finishing, exactly-once, broadcasts, and (on
the GPU) learning; the demo job is shortened but valid; a stage past its time is ended and the
next one still runs, with results written after each; the summary shows the plans side by side.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest

from plrl_api import spec as spec_mod
from plrl_api import utilisation
from scripts.gpu_check import __main__ as cli
from scripts.gpu_check import carry, collect, runner, stages
from scripts.gpu_check.results import Check, Results, StageResult, summary_text

REPO = pathlib.Path(__file__).parents[3]
H100 = json.loads((utilisation.CURVES_DIR / "h100.json").read_text())


# ------------------------------------------------------------------ carry


def test_pins_parse_mark_sdists_and_refuse_bad_lines() -> None:
    pins = carry.parse_pins("# comment\nfoo-bar==1.2  # why\n\nbaz==0.1  # sdist: built here\n")
    assert pins == [carry.Pin("foo-bar", "1.2"), carry.Pin("baz", "0.1", sdist=True)]
    with pytest.raises(ValueError, match="expected name==version"):
        carry.parse_pins("foo>=1\n")


def test_every_carried_wheel_is_pinned_at_the_locked_version() -> None:
    pins = carry.parse_pins((REPO / carry.PINS_FILE).read_text())
    lock = carry.lock_versions((REPO / carry.LOCK_FILE).read_text())
    assert {p.key: p.version for p in pins} == {p.key: lock.get(p.key) for p in pins}
    assert {p.key for p in pins} >= {"pydantic", "pydantic_core", "annotated_types", "typing_inspection"}


def test_wheel_problems_name_missing_doubled_and_unpinned_wheels() -> None:
    pins = [carry.Pin("pydantic", "2.1"), carry.Pin("pydantic-core", "2.5"), carry.Pin("hjson", "3.1")]
    wheels = [
        "pydantic-2.1-py3-none-any.whl",
        "pydantic_core-2.5-cp312-cp312-manylinux_2_17_x86_64.whl",
        "pydantic_core-2.4-cp312-cp312-manylinux_2_17_x86_64.whl",
        "stray-1.0-py3-none-any.whl",
    ]
    assert carry.wheel_problems(pins, wheels) == [
        "pydantic-core==2.5: found 2.4, 2.5",
        "hjson==3.1: no wheel",
        f"stray: not pinned in {carry.PINS_FILE}",
    ]
    assert carry.wheel_problems(pins[:1], wheels[:1]) == []


def _git(repo: pathlib.Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_what_travels_is_the_tree_git_sees_plus_the_wheels(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("/.whl/\n/runs/\n")
    (repo / "src" / "tracked.py").write_text("x = 1\n")
    _git(repo, "add", ".")
    (repo / "untracked.txt").write_text("new")
    (repo / "runs").mkdir()
    (repo / "runs" / "ignored.bin").write_bytes(b"\0" * 1000)
    (repo / ".whl").mkdir()
    (repo / ".whl" / "a-1-py3-none-any.whl").write_bytes(b"\0" * 300)
    files = dict(carry.carried_files(repo))
    assert files == {
        ".gitignore": 14,
        "src/tracked.py": 6,
        "untracked.txt": 3,
        ".whl/a-1-py3-none-any.whl": 300,
    }


def test_a_tree_over_64_mib_fails_the_dry_run(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    (repo / "requirements").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("/.whl/\n")
    (repo / carry.PINS_FILE).write_text("a==1\n")
    (repo / ".whl").mkdir()
    (repo / ".whl" / "a-1-py3-none-any.whl").write_bytes(b"\0" * 100)
    assert carry.dry_run(repo) == 0
    assert "fits" in capsys.readouterr().out
    with (repo / ".whl" / "huge.bin").open("wb") as f:
        f.truncate(carry.LIMIT_BYTES)  # sparse: no disk used, but its size travels
    assert carry.dry_run(repo) == 1
    out = capsys.readouterr().out
    assert "TOO BIG" in out and "64.00 MiB  .whl/huge.bin" in out


def test_the_cpu_mode_makes_the_gpu_images_missing_packages_absent() -> None:
    probe = (
        "import importlib.util as u\n"
        "assert u.find_spec('kubernetes') is None and u.find_spec('kopf') is None\n"
        "try:\n    import kopf\nexcept ModuleNotFoundError:\n    print('absent')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe], env=cli.child_env("cpu"), capture_output=True, text=True, cwd=REPO
    )
    assert (r.returncode, r.stdout.strip()) == (0, "absent"), r.stderr


# ------------------------------------------------------------------ judging stages

JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="tests.a" name="test_ok"/>
<testcase classname="tests.a" name="test_skip">
<skipped type="pytest.skip" message="needs a CUDA GPU"/></testcase>
{extra}</testsuite></testsuites>"""


def test_junit_reports_become_counts_failures_and_skip_reasons() -> None:
    bad = (
        '<testcase classname="tests.b" name="test_bad"><failure message="assert 1 == 2&#10;more"/></testcase>'
    )
    counts = collect.junit_counts([JUNIT.format(extra=""), JUNIT.format(extra=bad), None])
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["reports_missing"]) == (2, 1, 2, 1)
    assert counts["failures"] == ["tests.b::test_bad: assert 1 == 2"]
    assert counts["skip_reasons"] == {"needs a CUDA GPU": 2}


def test_all_skipped_is_a_skip_on_the_cpu_and_a_failure_on_the_gpu() -> None:
    only_skips = JUNIT.replace('<testcase classname="tests.a" name="test_ok"/>', "").format(extra="")
    counts = collect.junit_counts([only_skips])
    cpu = collect.tests_result("tests-engine", counts, [0], "cpu")
    gpu = collect.tests_result("tests-engine", counts, [0], "gpu")
    assert (cpu.status, gpu.status) == ("skipped", "failed")
    assert "needs a CUDA GPU" in cpu.reason and "no test ran" in gpu.reason
    passed = collect.tests_result("tests-engine", collect.junit_counts([JUNIT.format(extra="")]), [0], "gpu")
    assert passed.status == "passed"
    crashed = collect.tests_result("tests-engine", collect.junit_counts([JUNIT.format(extra="")]), [2], "gpu")
    assert crashed.status == "failed"


def test_the_measured_curve_needs_every_field_of_the_built_in_one() -> None:
    measured = dict(H100, name="h200", device="NVIDIA H200", raw_u=[0.1])
    assert collect.curve_result(measured, H100, "gpu", "curve-h200.json").status == "passed"
    no_peak = {k: v for k, v in measured.items() if k != "peak_tflops"}
    r = collect.curve_result(no_peak, H100, "gpu", "curve-h200.json")
    assert r.status == "failed" and "peak_tflops" in r.reason
    dipping = dict(measured, points=[[1, 0.2], [2, 0.1], [4, 0.3]])
    assert collect.curve_result(dipping, H100, "gpu", "x").status == "failed"
    assert collect.curve_result(dict(measured, dtype="float32"), H100, "gpu", "x").status == "failed"


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    from plrl_operator import plan_cli

    assert plan_cli.main(["--json", "-N", "128", "-B", "128", *args]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def test_the_plan_stage_knows_the_papers_numbers(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    curve = tmp_path / "curve-h200.json"
    curve.write_text(json.dumps(dict(H100, name="h200", points=[[16, 0.05], [64, 0.2], [256, 0.5]])))
    h100, measured = _plan(capsys), _plan(capsys, "--curve", str(curve))
    r = collect.plan_result(h100, measured, "h200")
    assert r.status == "passed", r.reason
    assert r.data["h100"]["generators"] == 44 and r.data["measured"]["curve"] == "h200"
    assert collect.plan_result(measured, measured, "h200").status == "failed"  # not the paper's plan
    assert collect.plan_result(h100, None, "h200").status == "failed"


SUMMARY = {
    "steps": 200,
    "reward_first_10pct": 0.62,
    "reward_last_10pct": 0.70,
    "mixed_version_samples": 300,
    "lag_mean": 1.3,
    "prompts": {"issued": 3200, "trained": 3190, "dropped_by_lag": 10},
}
JOB = {"total_steps": 200, "dtype": "bfloat16"}


def test_the_demo_run_is_judged_on_finishing_accounting_broadcasts_and_learning() -> None:
    def statuses(summary: dict[str, object], log: str = "ok", judge: bool = True) -> dict[str, bool | None]:
        r = collect.run_result(summary, JOB, 0, judge, 0.03, log)
        return {c.name: c.ok for c in r.checks}

    assert all(statuses(SUMMARY).values())
    assert statuses(dict(SUMMARY, reward_last_10pct=0.63))["learns"] is False
    assert statuses(dict(SUMMARY, reward_last_10pct=0.63), judge=False)["learns"] is None
    assert statuses(dict(SUMMARY, mixed_version_samples=0))["updates land in flight"] is False
    assert statuses(dict(SUMMARY, steps=150))["finished"] is False
    lost = dict(SUMMARY, prompts={"issued": 3200, "trained": 3100, "dropped_by_lag": 10})
    assert statuses(lost)["every prompt trained once"] is False
    missed = "WARNING weight v6: ['gen-0'] missing from epoch 17; retrying without"
    assert statuses(SUMMARY, log=missed)["every broadcast reached the generator"] is False
    assert collect.run_result(None, JOB, 1, True, 0.03).status == "failed"


@pytest.mark.parametrize("mode", ["gpu", "cpu"])
def test_the_demo_job_is_shortened_but_still_a_valid_job(mode: stages.Mode) -> None:
    import yaml

    settings = stages.RUN[mode]
    doc = stages.demo_job(yaml.safe_load((REPO / stages.DEMO_JOB).read_text()), settings)
    job = spec_mod.parse_job(doc)
    assert job.spec.training.total_steps == settings.total_steps
    assert job.spec.model.dtype == settings.dtype
    assert job.spec.resources.total_gpus == 2  # both roles: on the GPU machine they share its one device


def test_device_names_become_curve_names_like_the_built_in_one() -> None:
    assert stages.short_name("NVIDIA H200") == "h200"
    assert stages.short_name("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert stages.short_name(None) == "cpu"


# ------------------------------------------------------------------ running stages


def _stage(name: str, code: str, budget: float) -> stages.Stage:
    def commands(ctx: stages.Context) -> list[stages.Command]:
        return [stages.Command([ctx.python, "-c", code])]

    def judge(ctx: stages.Context, rcs: list[int | None]) -> StageResult:
        return StageResult(name, "passed" if rcs == [0] else "failed", f"rcs {rcs}")

    return stages.Stage(name, {"gpu": budget, "cpu": budget}, 0.5, commands, judge)


def test_a_stage_past_its_time_is_ended_and_the_next_one_still_runs(tmp_path: pathlib.Path) -> None:
    ctx = stages.Context(
        "cpu", REPO, tmp_path / "work", tmp_path / "out", sys.executable, cli.child_env("cpu")
    )
    ctx.work.mkdir()
    chosen = [
        _stage("slow", "import time; time.sleep(60)", 1.0),
        _stage("broken", "raise SystemExit(3)", 30.0),
        _stage("fine", "print('hello')", 30.0),
    ]
    results = runner.run_all(ctx, chosen, budget_s=60)
    assert [(s.name, s.status) for s in results.stages] == [
        ("slow", "timeout"),
        ("broken", "failed"),
        ("fine", "passed"),
    ]
    assert results.stages[0].seconds < 20 and not results.ok
    doc = json.loads((ctx.out / "results.json").read_text())
    assert doc["schema"] == "plrl-gpu-check/1" and doc["ok"] is False
    assert [s["status"] for s in doc["stages"]] == ["timeout", "failed", "passed"]
    assert "hello" in (ctx.out / "logs.txt").read_text()
    assert sorted(p.name for p in ctx.out.iterdir()) == sorted(runner.OUT_FILES)


def test_a_stage_is_not_started_without_its_floor_of_time(tmp_path: pathlib.Path) -> None:
    ctx = stages.Context(
        "cpu", REPO, tmp_path / "work", tmp_path / "out", sys.executable, cli.child_env("cpu")
    )
    ctx.work.mkdir()
    late = dataclasses.replace(_stage("late", "print(1)", 30.0), floor_s=100.0)
    results = runner.run_all(ctx, [late], budget_s=10)
    assert results.stages[0].status == "timeout" and "not started" in results.stages[0].reason


def test_the_summary_puts_the_two_plans_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    h100 = collect.pick_plan(_plan(capsys))
    measured = dict(h100, curve="h200", generators=40, speedup=1.8)
    r = Results(mode="gpu", started_at="t", budget_s=450, wall_s=300, host={"device": "NVIDIA H200"})
    r.stages = [
        StageResult("env", "passed"),
        StageResult("plan", "passed", data={"h100": h100, "measured": measured}),
        StageResult(
            "run-demo", "failed", "learns: reward 0.6 -> 0.6", checks=[Check("learns", False, "flat")]
        ),
    ]
    text = summary_text(r)
    assert "on NVIDIA H200" in text and "FAILED (1 of 3 stages)" in text
    assert any("pipeline I" in line and "44" in line and "40" in line for line in text.splitlines())
    assert any("speed-up" in line and "1.57x" in line and "1.80x" in line for line in text.splitlines())
