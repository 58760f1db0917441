"""A local run's step records read back: the live progress line, the summary and the PNG report.

Trainer rank 0 appends one `plrl_api.records.StepRecord` per optimizer step to
`<run-dir>/metrics.jsonl`; this module reads them (through the type, never by key) for `plrl run`'s
progress line and final summary, `plrl status` and the plot. A run that resumed from a checkpoint
re-trains the steps after it, so a step's latest record replaces the earlier ones: what is read
back is the history of the model the run ended with.

Neighbours: `plrl_workers.trainer` (the writer), `local.runner` and `local.status_cli` (the readers).
"""

from __future__ import annotations

import math
import pathlib
import statistics
from collections.abc import Sequence
from typing import Literal

import pydantic

from plrl_api import records

REPORT_FILE = "report.png"
SUMMARY_FILE = "summary.json"


def read_records(run_dir: pathlib.Path) -> list[records.StepRecord]:
    """The run's step records in step order, a re-trained step's latest record replacing the earlier."""
    path = run_dir / records.METRICS_FILE
    if not path.exists():
        return []
    history: list[records.StepRecord] = []
    for rec in records.read_step_records(path.read_text()):
        while history and history[-1].step >= rec.step:
            history.pop()  # a resumed run re-trained these steps
        history.append(rec)
    return history


Outcome = Literal["finished", "interrupted", "failed"]


class RunSummary(pydantic.BaseModel):
    """What `plrl run` prints at the end and writes to `summary.json`."""

    model_config = pydantic.ConfigDict(extra="forbid")

    outcome: Outcome = "finished"
    """How the run ended: trained every step, stopped by Ctrl-C/SIGTERM, or failed (see the message)."""
    total_steps: int | None = None
    """`training.totalSteps` of the job."""
    steps: int = 0
    reward_first_10pct: float | None = None
    reward_last_10pct: float | None = None
    lag_mean: float | None = None
    lag_max: int = 0
    mixed_version_samples: int = 0
    trained_tokens_per_s: float | None = None
    generated_tokens_per_s: float | None = None
    wall_seconds: float | None = None
    prompts: records.PromptCounts = pydantic.Field(default_factory=records.PromptCounts)
    peak_rss_mb: int | None = None


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.fmean(vals) if vals else None


def summarize(
    rows: Sequence[records.StepRecord],
    peak_rss_mb: int | None = None,
    outcome: Outcome = "finished",
    total_steps: int | None = None,
) -> RunSummary:
    """Reward early vs late (first and last 10% of steps), lag, throughput and totals."""
    if not rows:
        return RunSummary(peak_rss_mb=peak_rss_mb, outcome=outcome, total_steps=total_steps)
    k = max(1, len(rows) // 10)
    rewards = [r.reward_mean for r in rows]
    last = rows[-1]
    return RunSummary(
        outcome=outcome,
        total_steps=total_steps,
        steps=last.step,
        reward_first_10pct=_mean(rewards[:k]),
        reward_last_10pct=_mean(rewards[-k:]),
        lag_mean=_mean([r.lag_mean for r in rows]),
        lag_max=max(r.lag_max for r in rows),
        mixed_version_samples=sum(r.mixed_version_samples for r in rows),
        trained_tokens_per_s=_mean([r.trained_tokens_per_s for r in rows]),
        generated_tokens_per_s=_mean([r.generated_tokens_per_s for r in rows]),
        wall_seconds=last.elapsed_s,
        prompts=last.prompts,
        peak_rss_mb=peak_rss_mb,
    )


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


PROGRESS_LEGEND = (
    "reward: mean over the step's samples (1.0 = fully correct); lag: optimizer steps between the "
    "weights that produced a token and the trainer's; ESS: effective sample size of the importance "
    "weights (1.0 = on-policy); tok/s: whole-run averages"
)


def progress_line(row: records.StepRecord, total_steps: int) -> str:
    return (
        f"step {row.step}/{total_steps}  reward {_fmt(row.reward_mean)}  "
        f"lag {_fmt(row.lag_mean, '.1f')} (max {row.lag_max})  "
        f"gen {_fmt(row.generated_tokens_per_s, '.0f')} tok/s  "
        f"train {_fmt(row.trained_tokens_per_s, '.0f')} tok/s  "
        f"ESS {_fmt(row.ess)}  {_fmt(row.elapsed_s, '.0f')}s"
    )


def summary_text(summary: RunSummary) -> str:
    if not summary.steps:
        return "no optimizer step finished"
    p = summary.prompts
    of = f" of {summary.total_steps}" if summary.total_steps is not None else ""
    ended = "" if summary.outcome == "finished" else f" ({summary.outcome})"
    return "\n".join(
        [
            f"steps: {summary.steps}{of}{ended}  wall: {_fmt(summary.wall_seconds, '.0f')} s",
            f"reward: first 10% of steps {_fmt(summary.reward_first_10pct, '.3f')} -> "
            f"last 10% {_fmt(summary.reward_last_10pct, '.3f')}",
            f"lag (optimizer steps): mean {_fmt(summary.lag_mean)}, max {summary.lag_max}; "
            f"samples with tokens of 2+ weight versions: {summary.mixed_version_samples}",
            f"throughput: generated {_fmt(summary.generated_tokens_per_s, '.0f')} tok/s, "
            f"trained {_fmt(summary.trained_tokens_per_s, '.0f')} tok/s",
            "prompts: " + ", ".join(f"{k} {v}" for k, v in p.model_dump().items()),
            *_untrained_note(p, summary.outcome),
            *(
                [f"peak memory of the run's processes: {summary.peak_rss_mb} MB"]
                if summary.peak_rss_mb is not None
                else []
            ),
        ]
    )


def _untrained_note(prompts: records.PromptCounts, outcome: Outcome) -> list[str]:
    """Prompts issued but not trained when the run ended: say where they were and what becomes of them."""
    out = {
        "leased": prompts.leased,
        "requeued": prompts.requeued,
        "buffered": prompts.buffered,
        "in_training": prompts.in_training,
    }
    if not prompts.outstanding:
        return []
    where = ", ".join(f"{k} {v}" for k, v in out.items() if v)
    if outcome == "finished":
        # The prompt budget is totalSteps x B/G; only prompts issued to replace dropped ones can be out.
        return [
            f"note: {prompts.outstanding} issued prompts were not trained ({where}): they replaced prompts "
            "the lag policy dropped and were still in flight when training reached totalSteps"
        ]
    return [
        f"note: {prompts.outstanding} prompts were in flight when the run stopped ({where}); none is "
        "lost: resuming from the latest checkpoint issues them again"
    ]


def smoothed(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over `window` values (NaNs skipped; NaN where a window has none)."""
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1) : i + 1] if math.isfinite(v)]
        out.append(statistics.fmean(chunk) if chunk else math.nan)
    return out


def plot(
    rows: Sequence[records.StepRecord], out: pathlib.Path, title: str = "", reward: str = ""
) -> pathlib.Path:
    """Reward (per step and smoothed, with the summary's first/last 10% windows marked), lag and
    throughput against wall time, one panel each. `reward` names the reward function."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r.elapsed_s for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    per_step = [math.nan if r.reward_mean is None else r.reward_mean for r in rows]
    window = max(1, len(rows) // 20)
    axes[0].plot(t, per_step, label="mean reward per step", alpha=0.35)
    axes[0].plot(t, smoothed(per_step, window), label=f"smoothed ({window} steps)")
    k = max(1, len(rows) // 10)  # the summary's windows
    for part, name in ((rows[:k], "first 10%"), (rows[-k:], "last 10%")):
        mean = _mean([r.reward_mean for r in part])
        axes[0].axvspan(part[0].elapsed_s, part[-1].elapsed_s, alpha=0.12, color="C2")
        if mean is not None:
            axes[0].hlines(mean, part[0].elapsed_s, part[-1].elapsed_s, colors="C2")
            axes[0].annotate(f"{name}: {mean:.3f}", (part[0].elapsed_s, mean), fontsize=8, va="bottom")
    what = f" ({reward})" if reward else ""
    axes[0].set_ylabel(f"reward{what}\n1.0 = a fully correct answer")
    axes[1].plot(t, [r.lag_mean for r in rows], label="mean")
    axes[1].plot(t, [r.lag_max for r in rows], label="max", alpha=0.6)
    axes[1].set_ylabel("lag (optimizer steps)")
    axes[2].plot(t, [r.generated_tokens_per_s for r in rows], label="generated")
    axes[2].plot(t, [r.trained_tokens_per_s for r in rows], label="trained")
    axes[2].set_ylabel("tokens/s")
    axes[2].set_xlabel("wall time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def write_summary(run_dir: pathlib.Path, summary: RunSummary) -> None:
    (run_dir / SUMMARY_FILE).write_text(summary.model_dump_json(indent=2))
