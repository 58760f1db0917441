"""A run's metrics file, its summary and its PNG report.

Trainer rank 0 appends one JSON object per optimizer step to `<run-dir>/metrics.jsonl`; this
module reads it back for `plrl run`'s live progress line, its final summary, `plrl status` and the
plot. Neighbours: `trainer` (the writer), `local` and `local_status` (the readers).
"""

from __future__ import annotations

import json
import math
import pathlib
import statistics
from collections.abc import Sequence
from typing import Any

METRICS_FILE = "metrics.jsonl"
REPORT_FILE = "report.png"
SUMMARY_FILE = "summary.json"


def read_metrics(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    """Every complete line of the metrics file (a line being written is skipped)."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.fmean(xs) if xs else float("nan")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Reward early vs late (first and last 10% of steps), lag, throughput and totals."""
    if not rows:
        return {"steps": 0}
    k = max(1, len(rows) // 10)
    rewards = [r.get("reward_mean", float("nan")) for r in rows]
    return {
        "steps": rows[-1]["step"],
        "reward_first_10pct": _mean(rewards[:k]),
        "reward_last_10pct": _mean(rewards[-k:]),
        "lag_mean": _mean([r.get("lag_mean", float("nan")) for r in rows]),
        "lag_max": max((r.get("lag_max", 0) for r in rows), default=0),
        "mixed_version_samples": sum(r.get("mixed_version_samples", 0) for r in rows),
        "trained_tokens_per_s": _mean([r.get("trained_tokens_per_s", float("nan")) for r in rows]),
        "generated_tokens_per_s": _mean([r.get("generated_tokens_per_s", float("nan")) for r in rows]),
        "wall_seconds": rows[-1].get("elapsed_s", float("nan")),
        "prompts": rows[-1].get("prompts", {}),
    }


def progress_line(row: dict[str, Any], total_steps: int) -> str:
    def fmt(key: str, spec: str = ".2f") -> str:
        v = row.get(key)
        return "-" if v is None else format(v, spec)

    return (
        f"step {row['step']}/{total_steps}  reward {fmt('reward_mean')}  "
        f"lag {fmt('lag_mean', '.1f')} (max {row.get('lag_max', '-')})  "
        f"gen {fmt('generated_tokens_per_s', '.0f')} tok/s  "
        f"train {fmt('trained_tokens_per_s', '.0f')} tok/s  "
        f"ESS {fmt('ess')}  {fmt('elapsed_s', '.0f')}s"
    )


def summary_text(summary: dict[str, Any]) -> str:
    if not summary.get("steps"):
        return "no optimizer step finished"
    p = summary.get("prompts", {})
    return "\n".join(
        [
            f"steps: {summary['steps']}  wall: {summary['wall_seconds']:.0f} s",
            f"reward: first 10% of steps {summary['reward_first_10pct']:.3f} -> "
            f"last 10% {summary['reward_last_10pct']:.3f}",
            f"lag (optimizer steps): mean {summary['lag_mean']:.2f}, max {summary['lag_max']}; "
            f"samples with tokens of 2+ weight versions: {summary['mixed_version_samples']}",
            f"throughput: generated {summary['generated_tokens_per_s']:.0f} tok/s, "
            f"trained {summary['trained_tokens_per_s']:.0f} tok/s",
            "prompts: " + ", ".join(f"{k} {v}" for k, v in p.items()),
            *_untrained_note(p),
            *(
                [f"peak memory of the run's processes: {summary['peak_rss_mb']} MB"]
                if "peak_rss_mb" in summary
                else []
            ),
        ]
    )


def _untrained_note(prompts: dict[str, int]) -> list[str]:
    """Prompts still out when training ended: say so, since they were issued but never trained."""
    out = {k: prompts.get(k, 0) for k in ("leased", "requeued", "buffered", "in_training")}
    if not any(out.values()):
        return []
    where = ", ".join(f"{k} {v}" for k, v in out.items() if v)
    return [
        f"note: {sum(out.values())} issued prompts were not trained ({where}): they replaced prompts "
        "the lag policy dropped and were still in flight when training reached totalSteps"
    ]


def plot(rows: list[dict[str, Any]], out: pathlib.Path, title: str = "") -> pathlib.Path:
    """Reward, lag and throughput against wall time, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r.get("elapsed_s", 0.0) for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    axes[0].plot(t, [r.get("reward_mean") for r in rows], label="mean reward")
    axes[0].set_ylabel("reward")
    axes[1].plot(t, [r.get("lag_mean") for r in rows], label="mean")
    axes[1].plot(t, [r.get("lag_max") for r in rows], label="max", alpha=0.6)
    axes[1].set_ylabel("lag (optimizer steps)")
    axes[2].plot(t, [r.get("generated_tokens_per_s") for r in rows], label="generated")
    axes[2].plot(t, [r.get("trained_tokens_per_s") for r in rows], label="trained")
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


def write_summary(run_dir: pathlib.Path, summary: dict[str, Any]) -> None:
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
