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

Lag compensation in the loss (seed 3.2 / 5.3), on top of either name:

- `behaviour_kl` (beta >= 0, 0 = off): adds beta * (1 / N) * sum over completion tokens of
  k3_t = r_t - 1 - log r_t with r_t = pi_theta(y_t) / pi_behaviour(y_t). The tokens were sampled
  from pi_behaviour, so the mean of k3 estimates KL(pi_behaviour || pi_theta) (Schulman's k3:
  unbiased, never negative); its gradient, beta * (r_t - 1) * grad log pi_theta / N, pulls the
  policy back toward the weights that sampled the batch, the further it has moved since. Not
  multiplied by the sample weights: it is a trust region, not a learning signal.
- the staleness mix (`training.loss.staleWeight`) is a per-sample weight, set with the lag policy's
  (`rl/lag.py`), so it reaches the loss as `weight_t`.

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
# The KL penalty's log-ratio is clamped here (gradient held beyond): its gradient grows like r, and a
# token e^10 = 22,000 times likelier than when it was sampled is an outlier, not a trend to correct.
KL_MAX_LOG_RATIO = 10.0


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The spec's `training.loss` group, as the loss functions need it."""

    name: str = "reinforce_tis"
    is_clamp: float = 5.0
    behaviour_kl: float = 0.0
    """beta of the k3 KL penalty to the behaviour policy (0 = off)."""


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


def behaviour_kl_k3(x: LossInputs) -> torch.Tensor:
    """(1 / N) * sum over completion tokens of k3 = r - 1 - log r, r = pi_theta / pi_behaviour."""
    log_r = (x.logprobs.float() - x.behaviour_logprobs.float()).clamp(-KL_MAX_LOG_RATIO, KL_MAX_LOG_RATIO)
    k3 = log_r.exp() - 1.0 - log_r
    return torch.where(x.loss_mask, k3, torch.zeros_like(k3)).sum() / max(x.normalizer, 1.0)


def _with_penalty(x: LossInputs, cfg: LossConfig, pg: torch.Tensor, sums: Sums) -> torch.Tensor:
    """The policy-gradient term plus the optional KL penalty; both reported in `sums`."""
    loss = pg
    if cfg.behaviour_kl > 0:
        kl = behaviour_kl_k3(x)
        sums["kl_k3_sum"] = float(kl.detach()) * x.normalizer
        loss = pg + cfg.behaviour_kl * kl
    sums["loss_sum"] = float(loss.detach()) * x.normalizer
    return loss


@register("reinforce_tis")
def reinforce_tis(x: LossInputs, cfg: LossConfig) -> tuple[torch.Tensor, Sums]:
    """REINFORCE with truncated per-token importance weights min(pi_theta/pi_behaviour, clamp)."""
    truncated, sums = _diagnostics(x, cfg)
    return _with_penalty(x, cfg, _policy_gradient(x, truncated), sums), sums


@register("reinforce")
def reinforce(x: LossInputs, cfg: LossConfig) -> tuple[torch.Tensor, Sums]:
    """Plain REINFORCE with the group baseline already in the advantages; no IS correction."""
    _, sums = _diagnostics(x, cfg)
    pg = _policy_gradient(x, torch.ones_like(x.logprobs, dtype=torch.float32))
    return _with_penalty(x, cfg, pg, sums), sums


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
            "kl_k3": 0.0,
            "loss": 0.0,
        }
    w, w2 = sums["is_weight_sum"], sums["is_weight_sq_sum"]
    return {
        "ess": (w * w) / (n * w2) if w2 > 0 else 0.0,
        "is_weight_mean": w / n,
        "clamp_frac": sums["clamped_tokens"] / n,
        "ratio_mean": sums["ratio_sum"] / n,
        "kl": sums["kl_sum"] / n,
        # The penalty's own estimate (k3, clamped like the penalty); 0 when the penalty is off.
        "kl_k3": sums.get("kl_k3_sum", 0.0) / n,
        # Sum of micro-batch losses = the optimizer batch's loss (each is already divided by N).
        "loss": sums.get("loss_sum", 0.0) / n if math.isfinite(sums.get("loss_sum", 0.0)) else math.nan,
    }
