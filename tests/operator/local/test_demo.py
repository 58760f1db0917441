"""`make demo`'s job learns: the README's claim, checked on every CI run; so does each built-in
task's example job, and the demo's pipeline learns as much per sample as conventional RL.

Runs `examples/local-tiny.yaml` exactly as `make demo` does (a few minutes on 2 cores). The same run
is the suite's check of a whole pipeline run's outputs (checkpoints, report, accounting, every
worker stopped), of what the user sees on the terminal (progress, no library noise) and seed 0 of
the per-sample comparison: one run of a few minutes serves all four.
"""

from __future__ import annotations

import json
import pathlib
import re
import statistics

import pytest

from plrl_operator.local import report
from plrl_workers import checkpoint
from tests.infra import procs
from tests.operator.local.conftest import plrl

pytestmark = pytest.mark.slow

EXAMPLES = pathlib.Path(__file__).parents[3] / "examples"
DEMO_JOB = EXAMPLES / "local-tiny.yaml"
ARITH_JOB = EXAMPLES / "local-arith.yaml"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[procs.Completed, pathlib.Path]:
    """`make demo`'s run, once for the module: (the `plrl run` process, its run directory)."""
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    return plrl("run", str(DEMO_JOB), "--run-dir", str(run_dir), timeout=1800), run_dir


def _final_reward(run_dir: pathlib.Path) -> float:
    """The mean reward of the last 10% of the steps, as `plrl run`'s summary quotes it."""
    return float(json.loads((run_dir / report.SUMMARY_FILE).read_text())["reward_last_10pct"])


def test_the_demo_job_learns_with_weights_updated_in_flight(
    demo_run: tuple[procs.Completed, pathlib.Path],
) -> None:
    r, run_dir = demo_run
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # Progress is the only thing on screen: the workers' libraries (DeepSpeed's accelerator warning,
    # transformers' tqdm bars) write to the logs in the run directory, not here.
    library_noise = re.compile(r"warn|%\||it/s\]|traceback", re.IGNORECASE)
    noise = [line for line in out.splitlines() if library_noise.search(line)]
    assert noise == [], noise
    assert len(re.findall(r"^step \d+/400  reward ", r.stdout, re.MULTILINE)) >= 3, out  # progress shown
    summary = json.loads((run_dir / report.SUMMARY_FILE).read_text())
    first, last = summary["reward_first_10pct"], summary["reward_last_10pct"]
    # Clearly above: the per-step reward noise averaged over 10% of the steps is ~0.01.
    assert last - first >= 0.05, f"reward {first:.3f} -> {last:.3f}"
    assert summary["mixed_version_samples"] > 0
    # The generator runs at most one batch ahead of the trainer (plus what it has in flight), so a
    # sample is trained about one step after it was sampled, however fast the generator is: lag
    # costs learning per sample. With two batches of buffer and half a batch of finished groups
    # waiting behind it, this job trained at a mean lag of 2.0-2.5.
    assert 0 < summary["lag_mean"] <= 1.3, summary["lag_mean"]
    prompts = summary["prompts"]
    assert prompts["issued"] == prompts["trained"] + prompts["dropped_by_lag"]
    assert (run_dir / report.REPORT_FILE).stat().st_size > 0
    # checkpoint.everySteps 50, keep 2, 400 steps: the last two.
    kept = [p.name for p in checkpoint.checkpoints(run_dir / "checkpoints")]
    assert kept == ["step-00000350", "step-00000400"], kept
    # Every broadcast reached the generator: none waited out the join timeout for one that had
    # already stopped (it stops once every prompt is leased, before the last step is trained).
    assert "missing from epoch" not in (run_dir / "logs" / "trainer-0.log").read_text()
    assert r.leftover == []  # every worker stopped before `plrl run` exited


def test_the_arith_example_learns(run_dir: pathlib.Path) -> None:
    """`examples/local-arith.yaml`, the recipe for the second built-in task: measured at 0.465 ->
    0.593 (first to last 10% of 600 steps) with a per-step standard deviation of 0.05."""
    r = plrl("run", str(ARITH_JOB), "--run-dir", str(run_dir), "--quiet", timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((run_dir / report.SUMMARY_FILE).read_text())
    first, last = summary["reward_first_10pct"], summary["reward_last_10pct"]
    # The mean of 60 steps moves by ~0.007 from noise alone: 0.06 is half the measured gain.
    assert last - first >= 0.06, f"reward {first:.3f} -> {last:.3f}"
    prompts = summary["prompts"]
    assert prompts["issued"] == prompts["trained"] + prompts["dropped_by_lag"]


# Five more runs of the demo job: ~10 min on an idle 2-core machine, past the suite's 900 s default.
@pytest.mark.timeout(2400)
def test_the_demo_pipeline_learns_as_much_per_sample_as_conventional_rl(
    demo_run: tuple[procs.Completed, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    """Issue 12's bar: at equal samples (400 steps of 128) the pipeline's final reward lies within
    the seed-to-seed spread of conventional RL's (3 seeds each; a seed sets the data order and the
    sampling, the warm start is shared). Measured at the demo's lr 1.5e-4: pipeline 0.853
    (0.845-0.859), conventional 0.860 (0.848-0.874). The bench's numbers at lr 3e-4 would fail it, narrowly
    (pipeline 0.832, conventional 0.857 (0.846-0.872)), and those from when the generator ran
    further ahead (mean lag 1.5: 0.755) clearly; BENCHMARKS.md records both."""
    r, demo_dir = demo_run
    assert r.returncode == 0, r.stdout + r.stderr
    pipeline, conventional = [_final_reward(demo_dir)], list[float]()
    # Alternated, so that a slower stretch of the machine hits both modes alike.
    for seed, mode in [
        (0, "conventional"),
        (1, "pipeline"),
        (1, "conventional"),
        (2, "pipeline"),
        (2, "conventional"),
    ]:
        run_dir = tmp_path / f"{mode}-{seed}"
        sets = [f"spec.training.seed={seed}", f"spec.task.seed={seed}", f"spec.pipeline.mode={mode}"]
        args = [a for s in sets for a in ("--set", s)]
        done = plrl("run", str(DEMO_JOB), "--run-dir", str(run_dir), "--quiet", *args, timeout=1800)
        assert done.returncode == 0, done.stdout + done.stderr
        (pipeline if mode == "pipeline" else conventional).append(_final_reward(run_dir))
    # Each final reward is a mean of 40 steps whose rewards scatter by ~0.04 (standard deviation), so
    # it carries ~0.006 of noise itself: conventional's range is widened by 0.01 for it. Only the
    # lower edge is checked; a pipeline that learns more per sample would be welcome.
    median = statistics.median(pipeline)
    assert median >= min(conventional) - 0.01, (
        f"pipeline {pipeline} (median {median:.3f}), conventional {conventional}"
    )
