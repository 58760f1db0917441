"""Policy-gradient losses: one small pure function per `training.loss.name`, in a registry.

Every loss sees per-token tensors of one micro-batch (`LossInputs`) and returns
`(loss, sums)`. Normalisation, the same for every loss: **per token across the optimizer batch**,

    loss = -(1 / N) * sum over completion tokens t of  c_t * weight_t * A_t * log pi_theta(y_t)

where N (`normalizer`) is the number of completion tokens in the whole optimizer batch, on all
ranks and all micro-batches. So the micro-batch losses of a step add up to the batch loss, every
completion token counts equally whatever its sequence's length, and the gradient does not depend
on how the batch is packed or split across ranks (`rl/packing.py` sets N; `rl/step.py` multiplies by
the data-parallel world size because the backends average gradients over ranks). `weight_t` is the
sample's lag-policy weight (`rl/lag.py`), `A_t` its advantage (`rl/advantages.py`), and `c_t`:

- `reinforce_tis`: c_t = min(pi_theta / pi_behaviour, is_clamp), detached (truncated importance
  weight per token, as in PipelineRL); the gradient is c_t * A_t * grad log pi_theta.
- `reinforce`: c_t = 1 (no correction for lag; the diagnostics below are still reported).

log pi are log-probabilities of the sampled token under the temperature-scaled distribution,
log_softmax(logits / temperature), exactly what the generators record as behaviour logprobs.

`sums` are additive over micro-batches and ranks (token counts, sums of IS weights and their
squares, clamped tokens); `summarize` turns them into ESS (normalised effective sample size of the
truncated IS weights, (sum c)^2 / (n * sum c^2), 1 = all equal), mean IS weight, clamped fraction.

Neighbours: `rl/step.py` (computes log pi_theta and calls the registered loss), `rl/packing.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

# Bound on log(pi_theta / pi_behaviour) before exponentiating, so diagnostics stay finite.
_MAX_LOG_RATIO = 50.0


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The spec's `training.loss` group, as the loss functions need it."""

    name: str = "reinforce_tis"
    is_clamp: float = 5.0


@dataclasses.dataclass(frozen=True)
class LossInputs:
    """Per-token tensors of one micro-batch, all of shape [T]."""

    logprobs: torch.Tensor
    """log pi_theta of each target token (requires grad)."""
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    loss_mask: torch.Tensor
    normalizer: float
    """N: completion tokens in the whole optimizer batch."""


Sums = dict[str, float]
LossFn = Callable[[LossInputs, LossConfig], tuple[torch.Tensor, Sums]]

REGISTRY: dict[str, LossFn] = {}


def register(name: str) -> Callable[[LossFn], LossFn]:
    def add(fn: LossFn) -> LossFn:
        if name in REGISTRY:
            raise ValueError(f"loss {name!r} registered twice")
        REGISTRY[name] = fn
        return fn

    return add


def get(name: str) -> LossFn:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"training.loss.name={name!r} is unknown; known: {sorted(REGISTRY)}") from None


def importance_weights(x: LossInputs, is_clamp: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(raw ratio, truncated weight, clamped mask), detached; 0 / 1 / False outside the loss mask."""
    with torch.no_grad():
        log_ratio = (x.logprobs.float() - x.behaviour_logprobs.float()).clamp(max=_MAX_LOG_RATIO)
        ratio = torch.where(x.loss_mask, log_ratio.exp(), torch.zeros_like(log_ratio))
        clamped = x.loss_mask & (ratio > is_clamp)
        truncated = torch.where(clamped, torch.full_like(ratio, is_clamp), ratio)
    return ratio, truncated, clamped


def _diagnostics(x: LossInputs, cfg: LossConfig) -> tuple[torch.Tensor, Sums]:
    ratio, truncated, clamped = importance_weights(x, cfg.is_clamp)
    mask = x.loss_mask
    sums = {
        "tokens": float(mask.sum()),
        "is_weight_sum": float(truncated.sum()),
        "is_weight_sq_sum": float((truncated * truncated).sum()),
        "ratio_sum": float(ratio.sum()),
        "clamped_tokens": float(clamped.sum()),
        # k1 estimate of KL(behaviour || current) per token.
        "kl_sum": float(torch.where(mask, x.behaviour_logprobs - x.logprobs.detach(), 0.0).sum()),
    }
    return truncated, sums


def _policy_gradient(x: LossInputs, coef: torch.Tensor) -> torch.Tensor:
    per_token = -(coef * x.weights * x.advantages) * x.logprobs.float()
    return torch.where(x.loss_mask, per_token, torch.zeros_like(per_token)).sum() / max(x.normalizer, 1.0)


@register("reinforce_tis")
def reinforce_tis(x: LossInputs, cfg: LossConfig) -> tuple[torch.Tensor, Sums]:
    """REINFORCE with truncated per-token importance weights min(pi_theta/pi_behaviour, clamp)."""
    truncated, sums = _diagnostics(x, cfg)
    loss = _policy_gradient(x, truncated)
    sums["loss_sum"] = float(loss.detach()) * x.normalizer
    return loss, sums


@register("reinforce")
def reinforce(x: LossInputs, cfg: LossConfig) -> tuple[torch.Tensor, Sums]:
    """Plain REINFORCE with the group baseline already in the advantages; no IS correction."""
    _, sums = _diagnostics(x, cfg)
    loss = _policy_gradient(x, torch.ones_like(x.logprobs, dtype=torch.float32))
    sums["loss_sum"] = float(loss.detach()) * x.normalizer
    return loss, sums


def add_sums(a: Sums, b: Sums) -> Sums:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in a.keys() | b.keys()}


def summarize(sums: Sums) -> dict[str, float]:
    """Ratios from additive sums: ESS (normalised), mean IS weight, clamped fraction, mean ratio, KL."""
    n = sums.get("tokens", 0.0)
    if n <= 0:
        return {
            "ess": 1.0,
            "is_weight_mean": 1.0,
            "clamp_frac": 0.0,
            "ratio_mean": 1.0,
            "kl": 0.0,
            "loss": 0.0,
        }
    w, w2 = sums["is_weight_sum"], sums["is_weight_sq_sum"]
    return {
        "ess": (w * w) / (n * w2) if w2 > 0 else 0.0,
        "is_weight_mean": w / n,
        "clamp_frac": sums["clamped_tokens"] / n,
        "ratio_mean": sums["ratio_sum"] / n,
        "kl": sums["kl_sum"] / n,
        # Sum of micro-batch losses = the optimizer batch's loss (each is already divided by N).
        "loss": sums.get("loss_sum", 0.0) / n if math.isfinite(sums.get("loss_sum", 0.0)) else math.nan,
    }
