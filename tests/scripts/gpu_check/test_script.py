"""`scripts/gpu-check.sh` itself: the `--cpu` run CI does so the GPU check cannot rot, and the dry run.

The `--cpu` run goes through every stage the GPU run has (about 2 minutes on 2 cores): the probe,
`plrl profile --quick`, `plrl plan` with the H100 curve and the measured one, the `-m gpu` tests
(collected, then skipped: no CUDA), the decode bench on a tiny model, and 6 steps of the demo job
through `plrl run`, all with kopf, kubernetes and vLLM made absent as on the GPU image. Checked:
the exit code, the results.json schema and each stage's verdict, that the output folder holds only
the few plain files the GPU machine can return, and that the measured curve loads like a built-in.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess

import pytest

from plrl_api import utilisation
from tests.infra import procs

SCRIPT = pathlib.Path(__file__).parents[3] / "scripts" / "gpu-check.sh"


@pytest.fixture(scope="module")
def cpu_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[procs.Completed, pathlib.Path]:
    out = tmp_path_factory.mktemp("gpu-check-out")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # The check runs `plrl run`, whose workers have sessions of their own: kill the whole tree.
    r = procs.run_tree([str(SCRIPT), "--cpu", "--out", str(out)], timeout=600, env=env)
    return r, out


@pytest.mark.slow
def test_the_cpu_run_passes_every_stage_or_skips_what_needs_cuda(
    cpu_run: tuple[procs.Completed, pathlib.Path],
) -> None:
    r, out = cpu_run
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert r.leftover == []  # the check's own `plrl run` stopped every worker it started
    doc = json.loads((out / "results.json").read_text())
    assert (doc["schema"], doc["mode"], doc["ok"]) == ("plrl-gpu-check/1", "cpu", True)
    status = {s["name"]: s for s in doc["stages"]}
    assert list(status) == [
        "env",
        "profile",
        "plan",
        "tests-engine",
        "bench-decode",
        "run-demo",
        "tests-trainer",
    ]
    for name in ("env", "profile", "plan", "bench-decode", "run-demo"):
        assert status[name]["status"] == "passed", status[name]
    for name in ("tests-engine", "tests-trainer"):  # collected (they import), then skipped: no CUDA
        s = status[name]
        assert s["status"] == "skipped" and "CUDA" in s["reason"] and s["data"]["skipped"] > 0, s
    assert doc["host"]["torch"] and doc["host"]["device"] is None
    assert status["plan"]["data"]["h100"]["generators"] == 44
    assert [row["h"] for row in status["bench-decode"]["data"]["rows"]] == [4, 16]
    run = {c["name"]: c["ok"] for c in status["run-demo"]["checks"]}
    assert (
        run["finished"] and run["every prompt trained once"] and run["every broadcast reached the generator"]
    )
    summary = (out / "summary.txt").read_text()
    assert "PASSED" in summary and "H100 (built-in)" in summary and "torch engine" in summary


@pytest.mark.slow
def test_the_output_folder_holds_only_what_the_gpu_machine_returns(
    cpu_run: tuple[procs.Completed, pathlib.Path],
) -> None:
    _, out = cpu_run
    files = list(out.iterdir())
    assert 0 < len(files) <= 8  # the machine returns at most 8 plain files
    assert all(f.is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", f.name) for f in files)
    assert {"results.json", "summary.txt", "logs.txt", "curve-cpu.json", "run-demo.png"} == {
        f.name for f in files
    }
    curve = utilisation.load(out / "curve-cpu.json")  # the format `plrl plan --curve` reads
    builtin = json.loads((utilisation.CURVES_DIR / "h100.json").read_text())
    assert set(builtin) <= set(json.loads((out / "curve-cpu.json").read_text()))
    assert curve.name == "cpu" and curve.tau == builtin["tau"]


def test_the_dry_run_lists_what_travels_and_checks_its_size() -> None:
    r = subprocess.run([str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    total = re.search(r"^total ([0-9.]+) MiB of 64 MiB: fits$", r.stdout, re.MULTILINE)
    assert total is not None, r.stdout
    assert float(total[1]) < 64
    assert "workers/" in r.stdout and "wheels in .whl/" in r.stdout  # ready or not, the wheels are reported
