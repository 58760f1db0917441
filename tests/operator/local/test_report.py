"""`local.report`: what `plrl run` and `plrl status` print from the step records, and the plot.

Cases: a resumed run's re-trained steps replace the earlier records (the history of the final
model); the summary of a finished run explains prompts left out by the lag policy, that of an
interrupted run says it stopped early and that in-flight prompts are issued again on resume; the
progress line shows every column with its value; the plot is written, with the windows the
summary quotes.
"""

from __future__ import annotations

import pathlib

from plrl_api import records
from plrl_operator.local import report
from tests import samples


def _write(run_dir: pathlib.Path, steps: list[int]) -> None:
    text = "".join(samples.step_record(step=s, version=s).to_json() + "\n" for s in steps)
    (run_dir / records.METRICS_FILE).write_text(text)


def test_re_trained_steps_replace_the_earlier_records(tmp_path: pathlib.Path) -> None:
    _write(tmp_path, [1, 2, 3, 4, 3, 4, 5])  # resumed from the checkpoint at step 2
    assert [r.step for r in report.read_records(tmp_path)] == [1, 2, 3, 4, 5]


def test_the_summary_says_how_the_run_ended(tmp_path: pathlib.Path) -> None:
    _write(tmp_path, list(range(1, 21)))
    rows = report.read_records(tmp_path)  # 4 prompts still buffered (samples.step_record)
    finished = report.summary_text(report.summarize(rows, outcome="finished", total_steps=20))
    assert finished.startswith("steps: 20 of 20  wall:")
    assert "they replaced prompts the lag policy dropped" in finished
    stopped = report.summary_text(report.summarize(rows, outcome="interrupted", total_steps=400))
    assert stopped.startswith("steps: 20 of 400 (interrupted)")
    assert "4 prompts were in flight when the run stopped (buffered 4)" in stopped
    assert "resuming from the latest checkpoint issues them again" in stopped
    assert "lag policy" not in stopped


def test_progress_line_and_plot(tmp_path: pathlib.Path) -> None:
    _write(tmp_path, list(range(1, 41)))
    rows = report.read_records(tmp_path)
    line = report.progress_line(rows[-1], 400)
    assert line.startswith(
        "step 40/400  reward 0.38  lag 1.2 (max 3)  gen 800 tok/s  train 1000 tok/s  ESS 0.90"
    )
    png = report.plot(rows, tmp_path / report.REPORT_FILE, title="t", reward="builtin:exact_match")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.smoothed([1.0, float("nan"), 3.0], 2) == [1.0, 1.0, 3.0]
