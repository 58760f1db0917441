"""`plrl profile --quick` (a smoke test of the command) writes a curve `plrl plan` accepts, under runs/."""

from __future__ import annotations

import pathlib

import pytest

from plrl_api import utilisation
from plrl_operator import plan_cli
from plrl_workers import profiler


def test_quick_profile_writes_a_curve_plan_accepts(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cpu.json"
    assert profiler.main(["--quick", "--device", "cpu", "--repeats", "1", "--out", str(out)]) == 0
    curve = utilisation.load(out)
    assert curve.hs == (4.0, 16.0, 64.0)
    assert all(0 < u <= 1 for u in curve.us)
    assert list(curve.us) == sorted(curve.us)
    assert curve.extra["dtype"] == "float32" and curve.extra["peak_source"] == "best measured"
    # padding: U(h) <= h / (h + 64) when peak is the best full-product rate measured
    assert curve.u(4) <= 4 / 68 * 1.5
    capsys.readouterr()
    assert plan_cli.main(["--curve", str(out), "-N", "16", "-B", "64", "-R", "1"]) == 0
    assert "curve cpu" in capsys.readouterr().out


def test_monotone_pools_dips() -> None:
    assert profiler.monotone([0.1, 0.3, 0.2, 0.5]) == pytest.approx([0.1, 0.25, 0.25, 0.5])
    assert profiler.monotone([0.2, 0.4]) == [0.2, 0.4]


def test_nominal_peaks_prefer_specific_names() -> None:
    assert profiler.nominal_peak("NVIDIA H100 PCIe") == 756.0
    assert profiler.nominal_peak("NVIDIA H100 80GB HBM3") == 989.4
    assert profiler.nominal_peak("NVIDIA L40S") == 362.05
    assert profiler.nominal_peak("Some Future Chip") is None


def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert profiler.main(["--quick", "--repeats", "0"]) == 2
    assert "--repeats=0 must be at least 1" in capsys.readouterr().err


def test_the_curve_goes_under_runs_by_default(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a checkout: nothing may land beside the user's files
    assert profiler.main(["--quick", "--device", "cpu", "--repeats", "1"]) == 0
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()] == [
        pathlib.Path("runs/profile/curve-cpu.json")
    ]
