"""Plain data that crosses the policy's seams: plans, rate observations, scaling decisions.

The planner (`policy.planner`) returns a `Plan`; the operator's timer and the local runner build
`Observation`s from the workers' reported rates and pass them to `policy.autoscaler`, which
answers with a `Decision`. Everything here is a frozen dataclass of numbers and strings, so the
operator can store it in status (`to_dict`) and the local runner can log it as JSON.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


@dataclasses.dataclass(frozen=True)
class ConventionalRates:
    """Conventional RL (all N accelerators generate, then all train), in tokens per flash."""

    r_gen: float
    """K / t_gen: tokens generated per flash during the generation phase."""
    r_train: float
    """N / tau: tokens trained per flash during the training phase."""
    r_conv: float
    """Harmonic combination 1 / (1/r_gen + 1/r_train): the phases alternate."""
    steps_per_round: int
    """R: optimizer steps per round (S = B * R sequences generated per round; the paper's G)."""
    max_lag: int
    """R - 1: the last optimizer step of a round trains on samples that many steps old."""


@dataclasses.dataclass(frozen=True)
class PipelineRates:
    """PipelineRL with I generator and N - I trainer accelerators, in tokens per flash."""

    generators: int
    """I: accelerators that only generate."""
    concurrency: int
    """H: sequences decoded at once on each generator accelerator."""
    utilisation: float
    """U(H): fraction of peak FLOP/s a generator reaches at batch H."""
    r_gen: float
    """U(H) * I."""
    r_train: float
    """(N - I) / tau."""
    r_pipeline: float
    """min(r_gen, r_train): the slower side sets the pace."""
    lag_steps: float
    """H * I * L / (Lbar * B): optimizer steps a sequence of maximal length spans (unrounded)."""
    g_max: int
    """ceil(lag_steps): the model's maximum lag in optimizer steps."""

    @property
    def bottleneck(self) -> str:
        return "generation" if self.r_gen <= self.r_train else "training"


@dataclasses.dataclass(frozen=True)
class Plan:
    """The planner's answer for one job or cluster size: both methods side by side."""

    n_gpus: int
    batch_size: int
    max_len: int
    mean_len: float
    tau: float
    curve: str
    """Name of the utilisation curve the rates were computed with."""
    conventional: ConventionalRates
    pipeline: PipelineRates
    generator_pods: int
    trainer_pods: int
    balance_generators: float
    """I at which r_gen = r_train for the chosen H, before rounding to whole pods."""
    max_lag_limit: int | None
    """The lag limit the plan was chosen under (None: unlimited)."""

    @property
    def trainers(self) -> int:
        return self.n_gpus - self.pipeline.generators

    @property
    def speedup(self) -> float:
        return self.pipeline.r_pipeline / self.conventional.r_conv

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["trainers"] = self.trainers
        out["speedup"] = self.speedup
        out["pipeline"]["bottleneck"] = self.pipeline.bottleneck
        return out


@dataclasses.dataclass(frozen=True)
class RateSample:
    """Rates measured over one optimizer step (or a short window ending at it).

    Both rates are *capacities*: tokens per second of the time the side was actually working.
    A generator stalled by backpressure or a trainer waiting for rollouts must not count the
    waiting time, otherwise both rates collapse onto the slower one and the ratio is pinned at 1.
    """

    step: int
    """Optimizer step the sample ends at."""
    generators: int
    """I (generator accelerators) in effect while the sample was taken."""
    gen_tokens_per_s: float
    """Tokens the generators decode per second while running (all generators together)."""
    train_tokens_per_s: float
    """Tokens the trainers process per second while busy (all trainers together)."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the autoscaler sees: the current step, the current I and recent rate samples."""

    step: int
    generators: int
    samples: tuple[RateSample, ...]
    step_seconds: float | None = None
    """Recent time per optimizer step (seconds, or flashes when simulated); None: unknown."""
    rescale_cost_s: float | None = None
    """What the last change of I cost, in the same unit: from the decision until training was back
    at the step it had reached (restart plus steps trained again). None: no change measured yet."""


class ScaleAction(enum.StrEnum):
    HOLD = "hold"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"


@dataclasses.dataclass(frozen=True)
class AutoscalerState:
    """What the autoscaler remembers between decisions (kept in job status by the operator)."""

    last_eval_step: int | None = None
    last_change_step: int | None = None
    last_action: ScaleAction = ScaleAction.HOLD
    pending: ScaleAction = ScaleAction.HOLD
    """A reversal of `last_action` seen at the last look, waiting for confirmation at the next."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "lastEvalStep": self.last_eval_step,
            "lastChangeStep": self.last_change_step,
            "lastAction": self.last_action.value,
            "pending": self.pending.value,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> AutoscalerState:
        """Inverse of `to_dict`; unknown or missing keys fall back to a fresh state."""
        if not d:
            return cls()
        return cls(
            last_eval_step=_opt_int(d.get("lastEvalStep")),
            last_change_step=_opt_int(d.get("lastChangeStep")),
            last_action=_action(d.get("lastAction")),
            pending=_action(d.get("pending")),
        )


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _action(v: Any) -> ScaleAction:
    return ScaleAction(v) if v in ScaleAction._value2member_map_ else ScaleAction.HOLD


@dataclasses.dataclass(frozen=True)
class Decision:
    """The autoscaler's answer: the I to run with, why, and the state to remember."""

    action: ScaleAction
    generators: int
    """Target I (equal to `previous` when holding)."""
    previous: int
    step: int
    ratio: float | None
    """Measured r_pipeline / r_gen the decision was based on (None: not evaluated)."""
    reason: str
    """One human-readable sentence; becomes the message of a Kubernetes Event on a change."""
    state: AutoscalerState

    @property
    def changed(self) -> bool:
        return self.generators != self.previous

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "generators": self.generators,
            "previous": self.previous,
            "step": self.step,
            "ratio": self.ratio,
            "reason": self.reason,
            "state": self.state.to_dict(),
        }
