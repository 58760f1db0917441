"""`plrl plan`: the paper's example by default, job files as input, one-line errors for bad input."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from plrl_operator import plan_cli

JOB = """\
apiVersion: pipelinerl.io/v1alpha1
kind: PipelineRLJob
metadata: {name: demo}
spec:
  model: {name: /models/demo}
  resources: {totalGPUs: 64, gpusPerGenerator: 2, gpusPerTrainer: 4}
  generation: {concurrentSequences: 128, maxNewTokens: 2048}
  training: {batchSize: 512}
  pipeline: {maxLag: 16}
"""


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = plan_cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_default_is_the_papers_worked_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run([], capsys)
    assert code == 0
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert lines["r_gen"][1:3] == ["18.32", "16.90"]
    assert lines["throughput"][1:3] == ["10.75", "16.90"]
    assert "1.57x" in out and "H = 192" in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--json", "-N", "256", "-B", "2048"], capsys)
    assert code == 0
    plan = json.loads(out)
    assert plan["n_gpus"] == 256 and plan["batch_size"] == 2048
    assert plan["pipeline"]["generators"] + plan["trainers"] == 256
    assert plan["speedup"] == pytest.approx(plan["pipeline"]["r_pipeline"] / plan["conventional"]["r_conv"])


def test_job_file_supplies_the_inputs(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    code, out, _ = _run([str(job), "--json"], capsys)
    assert code == 0
    plan = json.loads(out)
    i = plan["pipeline"]["generators"]
    assert plan["n_gpus"] == 64 and plan["max_len"] == 2048 and plan["pipeline"]["concurrency"] == 128
    assert i % 2 == 0 and (64 - i) % 4 == 0
    assert plan["pipeline"]["g_max"] <= 16
    assert plan["conventional"]["steps_per_round"] == 1  # this project's conventional mode
    # flags override the job; 'none' lifts its lag limit
    code, out, _ = _run([str(job), "--json", "--max-lag", "none", "-H", "auto"], capsys)
    assert code == 0 and json.loads(out)["max_lag_limit"] is None


def _curve(tmp_path: pathlib.Path, points: list[list[float]]) -> str:
    path = tmp_path / "curve.json"
    path.write_text(json.dumps({"name": "mine", "points": points}))
    return str(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-N", "0"], "total GPUs N=0 must be positive"),
        (["-N", "-3"], "total GPUs N=-3 must be positive"),
        (["-N", "64", "-I", "64"], "generators I=64 must be less than the total GPUs N=64"),
        (["-N", "64", "-I", "80"], "generators I=80 must be less than the total GPUs N=64"),
        (["--max-lag", "0"], "no generator count satisfies max lag 0"),
        (["-H", "192", "--max-lag", "2"], "no generator count satisfies max lag 2"),
        (["-N", "lots"], "argument --gpus/-N: invalid int value: 'lots'"),
        (["--curve", "/nonexistent/curve.json"], "cannot read curve"),
        (["--tau", "-1"], "tau=-1.0 must be a positive number"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == ""
    assert err.startswith("plrl plan: error: ") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([[16, 0.3], [64, 0.2]], "U must not decrease as h grows, but U(64)=0.2 < U(16)=0.3"),
        ([[16, 0.3], [64, 1.5]], "U=1.5 at h=64 must be in (0, 1]"),
    ],
)
def test_bad_curve_files(
    tmp_path: pathlib.Path, points: list[list[float]], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(["--curve", _curve(tmp_path, points)], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err


def test_bad_job_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("totalGPUs: 64", "totalGPUs: 1"))
    code, _, err = _run([str(job)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "spec.resources.totalGPUs" in err


def test_through_the_plrl_command_no_traceback(tmp_path: pathlib.Path) -> None:
    bad = _curve(tmp_path, [[16, 0.5], [32, 0.4]])
    proc = subprocess.run(
        [sys.executable, "-m", "plrl_operator.cli", "plan", "--curve", bad],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
