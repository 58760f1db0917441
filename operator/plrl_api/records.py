"""The records that travel between the workers and the controllers: one row per optimizer step, and
each worker's heartbeat report, with the Lease annotations that carry it.

- `StepRecord`: trainer rank 0 writes one per optimizer step (a line of `metrics.jsonl` under
  `plrl run`; the latest one in its heartbeat). The local runner's progress, summary and plot,
  `plrl status`, the heartbeat's `Progress` and the bench scripts all read it through this type.
- `Progress`: the job-level numbers trainer rank 0 puts in its Lease (`ANNOTATION_PROGRESS`); the
  operator fills the job's STEP, LAG, REWARD and TOK/S columns from it and, once `finished` is
  set, marks the job Succeeded.
- `WorkerReport`: what any worker says at each renewal; `lease_annotations` / `parse_annotations`
  are the two directions of the Lease encoding (pure: the worker's heartbeat and the operator's
  status are the I/O on either side).

Neighbours: `plrl_api.names` (the annotation keys), `plrl_workers.trainer` (writes StepRecords),
`plrl_workers.heartbeat` (renews Leases), `plrl_operator.status` (reads them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic
from pydantic import Field
from pydantic.alias_generators import to_camel

from plrl_api import names


def finite(value: Any) -> float | None:
    """`value` as a finite float, or None (absent, non-numeric, NaN or infinite)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# --------------------------------------------------------------------------- per optimizer step

METRICS_FILE = "metrics.jsonl"
"""Under `plrl run`, trainer rank 0 appends one `StepRecord` per line to `<run-dir>/<METRICS_FILE>`."""
HEARTBEAT_DIR = "heartbeats"
"""Under `plrl run`, every worker process writes its Lease object (JSON) to
`<run-dir>/<HEARTBEAT_DIR>/<process>.json` (what a pod renews on the API server)."""


class PromptCounts(pydantic.BaseModel):
    """The coordinator's prompt accounting: every issued prompt is in exactly one other field.

    `issued == trained + dropped_by_lag + leased + requeued + buffered + in_training` always holds.
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    issued: int = 0
    trained: int = 0
    dropped_by_lag: int = 0
    leased: int = 0
    """Out with a generator."""
    requeued: int = 0
    """Returned (lease expired, generator dead) and waiting to be leased again."""
    buffered: int = 0
    """Rollouts accepted, waiting for a trainer."""
    in_training: int = 0
    """Taken by the trainer for the step in progress."""

    @property
    def outstanding(self) -> int:
        """Issued but neither trained nor dropped yet."""
        return self.leased + self.requeued + self.buffered + self.in_training

    @property
    def balanced(self) -> bool:
        return self.issued == self.trained + self.dropped_by_lag + self.outstanding


class StepRecord(pydantic.BaseModel):
    """One optimizer step as trainer rank 0 saw it (a line of `metrics.jsonl`)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    step: int = Field(ge=1, description="Optimizer steps done, this one included.")
    version: int = Field(ge=0, description="Weight version after this step.")
    elapsed_s: float = Field(description="Seconds since the first batch arrived.")
    step_s: float = Field(description="Wall time of this step, waiting for rollouts included.")
    busy_s: float = Field(description="Time of this step spent training (not waiting).")
    reward_mean: float | None = Field(description="Mean reward of the batch's samples (None: no sample).")
    lag_mean: float = Field(description="Mean policy lag of the batch's tokens, optimizer steps.")
    lag_max: int = Field(description="Largest policy lag of a token in the batch.")
    mixed_version_samples: int = Field(description="Samples holding tokens of 2+ weight versions.")
    completion_tokens: int = Field(description="Tokens generated for the batch's samples.")
    generated_tokens_per_s: float = Field(description="Whole-run average of generated tokens/s.")
    trained_tokens_per_s: float = Field(description="Whole-run average of trained tokens/s (prompts too).")
    train_busy_tokens_per_s: float = Field(description="Trained tokens per busy second of this step.")
    input_tokens: float = Field(description="Tokens this step trained on (prompts and completions).")
    loss: float = Field(description="The batch's loss.")
    ess: float = Field(
        description="Effective sample size of the importance weights, normalised to (0, 1]: 1 = on-policy."
    )
    prompts: PromptCounts = Field(description="The coordinator's accounting after this step.")
    details: dict[str, float | None] = Field(
        default_factory=dict, description="Further loss, lag and advantage diagnostics, by name."
    )

    @property
    def completion_tokens_per_busy_second(self) -> float | None:
        """The trainers' capacity as the autoscaler reads it: what they would train if never kept
        waiting for rollouts (None: the step had no busy time to divide by)."""
        return self.completion_tokens / self.busy_s if self.busy_s > 0 else None

    def to_json(self) -> str:
        """One line of `metrics.jsonl` (non-finite numbers become null, so every line is valid JSON)."""
        return json.dumps(_json_safe(self.model_dump(mode="python")), separators=(",", ":"))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def read_step_records(text: str) -> list[StepRecord]:
    """Every complete line of a `metrics.jsonl`; a line still being written (not JSON yet) is
    skipped, a JSON line that is not a `StepRecord` raises (a writer/reader mismatch must not
    silently drop rows)."""
    rows = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.append(StepRecord.model_validate(doc))
    return rows


# --------------------------------------------------------------------------- the job's progress


class _Camel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Lag(_Camel):
    """Policy lag of trained tokens, in optimizer steps."""

    mean: float = Field(default=0.0, ge=0, description="Mean lag over the last optimizer step.")
    max: int = Field(default=0, ge=0, description="Largest lag over the last optimizer step.")


class Throughput(_Camel):
    """Token rates, averaged over the run."""

    generated_tokens_per_second: float = Field(default=0.0, ge=0, description="Tokens/s generated.")
    trained_tokens_per_second: float = Field(default=0.0, ge=0, description="Tokens/s trained.")
    ratio: float = Field(default=0.0, ge=0, description="trained / generated tokens per second.")


class SlowGenerator(_Camel):
    """A generator the coordinator finds slow against its peers (`plrl_api.peers.slow`), now."""

    generator: str = Field(description="Its generator id (its pod's name in a cluster).")
    slow_for_seconds: float = Field(ge=0, description="How long it has been slow without a break, s.")
    rate: float = Field(ge=0, description="Its rollout groups accepted per second over the window.")
    peers_median: float = Field(ge=0, description="The median of its peers' rates.")
    migrated: int = Field(default=0, ge=0, description="Its leases migrated to its peers so far.")


class Progress(_Camel):
    """What trainer rank 0 reports in its Lease annotation `pipelinerl.io/progress` (JSON)."""

    step: int = Field(default=0, ge=0)
    weight_version: int = Field(default=0, ge=0)
    lag: Lag = Field(default_factory=Lag)
    reward: float | None = None
    throughput: Throughput = Field(default_factory=Throughput)
    finished: bool = False
    """The last step is trained and checkpointed: the job has succeeded."""
    slow_generators: list[SlowGenerator] = Field(default_factory=list)
    """Generators slow against their peers now (their controllers replace one that stays slow)."""


def progress(
    record: StepRecord | None,
    *,
    step: int = 0,
    weight_version: int = 0,
    finished: bool = False,
    slow_generators: Sequence[SlowGenerator] = (),
) -> Progress:
    """The job's `Progress` from the latest step record.

    Without a record yet (e.g. a resumed job that is already done) only `step`, `weight_version`
    and `finished` are known.
    """
    slow = list(slow_generators)
    if record is None:
        return Progress(step=step, weight_version=weight_version, finished=finished, slow_generators=slow)
    generated = max(0.0, finite(record.generated_tokens_per_s) or 0.0)
    trained = max(0.0, finite(record.trained_tokens_per_s) or 0.0)
    return Progress(
        step=record.step,
        weight_version=record.version,
        lag=Lag(mean=max(0.0, finite(record.lag_mean) or 0.0), max=max(0, record.lag_max)),
        reward=finite(record.reward_mean),
        throughput=Throughput(
            generated_tokens_per_second=generated,
            trained_tokens_per_second=trained,
            ratio=trained / generated if generated > 0 else 0.0,
        ),
        finished=finished,
        slow_generators=slow,
    )


# --------------------------------------------------------------------------- heartbeat reports


class WorkerReport(pydantic.BaseModel):
    """What one worker says about itself at one renewal; None fields are left out of the Lease."""

    model_config = pydantic.ConfigDict(frozen=True)

    role: names.Role
    weight_version: int | None = None
    tokens_per_second: float | None = None
    """Generator: tokens generated; trainer: tokens trained (both over the metrics window)."""
    queue_depth: int | None = None
    """Generator: rollout groups waiting for the coordinator; trainer rank 0: groups buffered."""
    utilisation: float | None = None
    """Generator: sequences in flight / capacity; trainer: busy share of the last step."""
    capacity_tokens_per_second: float | None = None
    """Completion tokens per second of the time this worker was working, not waiting: generator:
    decoded over the metrics window; trainer rank 0: trained in the last step (all ranks). What the
    autoscaler compares (observed rates are throttled by whichever side is slower)."""
    progress: Progress | None = None
    """Trainer rank 0 only: the job's progress."""


def lease_annotations(report: WorkerReport) -> dict[str, str]:
    """The Lease annotations for `report` (string values, as Kubernetes requires)."""
    out: dict[str, str] = {names.ANNOTATION_ROLE: report.role}
    if report.weight_version is not None:
        out[names.ANNOTATION_WEIGHT_VERSION] = str(report.weight_version)
    tps = finite(report.tokens_per_second)
    if tps is not None:
        out[names.ANNOTATION_TOKENS_PER_SECOND] = f"{max(0.0, tps):.1f}"
    if report.queue_depth is not None:
        out[names.ANNOTATION_QUEUE_DEPTH] = str(report.queue_depth)
    util = finite(report.utilisation)
    if util is not None:
        out[names.ANNOTATION_UTILISATION] = f"{min(1.0, max(0.0, util)):.3f}"
    cap = finite(report.capacity_tokens_per_second)
    if cap is not None:
        out[names.ANNOTATION_CAPACITY] = f"{max(0.0, cap):.1f}"
    if report.progress is not None:
        out[names.ANNOTATION_PROGRESS] = report.progress.model_dump_json(by_alias=True)
    return out


def _opt_int(raw: str | None) -> int | None:
    x = finite(raw)
    return int(x) if x is not None else None


def parse_annotations(annotations: Mapping[str, str]) -> WorkerReport | None:
    """The report a Lease carries, or None if it is not a worker's. Bad values read as absent:
    a worker's Lease is input the operator must survive, not trust."""
    role = annotations.get(names.ANNOTATION_ROLE)
    if role not in names.ROLES:
        return None
    raw = annotations.get(names.ANNOTATION_PROGRESS)
    prog: Progress | None = None
    if raw:
        try:
            prog = Progress.model_validate(json.loads(raw))
        except (ValueError, pydantic.ValidationError):
            prog = None
    return WorkerReport(
        role=role,
        weight_version=_opt_int(annotations.get(names.ANNOTATION_WEIGHT_VERSION)),
        tokens_per_second=finite(annotations.get(names.ANNOTATION_TOKENS_PER_SECOND)),
        queue_depth=_opt_int(annotations.get(names.ANNOTATION_QUEUE_DEPTH)),
        utilisation=finite(annotations.get(names.ANNOTATION_UTILISATION)),
        capacity_tokens_per_second=finite(annotations.get(names.ANNOTATION_CAPACITY)),
        progress=prog,
    )
