"""One RL optimizer step: rollout groups -> packed micro-batches -> loss -> engine update.

- `prepare(groups, trainer_version, world_size, cfg)`: the lag policy (`rl/lag.py`), leave-one-out
  advantages (`rl/advantages.py`) and packing (`rl/packing.py`) for one optimizer batch, with the
  counts the trainer reports (dropped, down-weighted, zero-advantage groups).
- `rl_step(model, micro_batch, cfg) -> (loss, sums)`: forward one packed micro-batch, compute the
  per-token log-probabilities and the registered loss (`rl/losses.py`); asserts finiteness.
- `train_step(engine, micro_batches, cfg)`: this rank's micro-batches through a `TrainingEngine`
  and one optimizer step; returns metrics summed over all ranks.

Log-probabilities are those of the temperature-scaled distribution, log_softmax(logits / T) with
T = spec `generation.temperature` (T below `engines/sampling.GREEDY_EPS` counts as 1, as there):
the definition of a behaviour logprob in `engines/sampling.py` with top_p = 1, the RL default.
With any other definition pi_theta / pi_behaviour would not be 1 on-policy. With top_p < 1 the
generators record nucleus-masked logprobs; the trainer does not re-apply a nucleus under
pi_theta (a sampled token outside the trainer's nucleus would get log 0 = -inf), so ratios of
sampled tokens are then slightly below 1.

Neighbours: the trainer role's main loop (calls `prepare` and `train_step`), `engines/base.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from plrl_workers import protocol
from plrl_workers.engines import sampling
from plrl_workers.rl import advantages, delay_compensation, lag, losses, packing

if TYPE_CHECKING:
    from plrl_api import spec as spec_mod
    from plrl_workers.engines import base


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Everything the RL math reads from the job spec."""

    loss: losses.LossConfig = dataclasses.field(default_factory=losses.LossConfig)
    temperature: float = 1.0
    normalize_advantages: bool = False
    tokens_per_micro_batch: int = 8192
    max_lag: int = 8
    lag_policy: str = lag.DROP
    stale_weight: float = 1.0

    @classmethod
    def from_spec(cls, spec: spec_mod.JobSpec) -> RLConfig:
        t = spec.training
        return cls(
            loss=losses.LossConfig(
                name=t.loss.name, is_clamp=t.loss.is_clamp, behaviour_kl=t.loss.behaviour_kl
            ),
            temperature=spec.generation.temperature,
            normalize_advantages=t.loss.normalize_advantages,
            tokens_per_micro_batch=t.tokens_per_micro_batch,
            max_lag=spec.pipeline.max_lag,
            lag_policy=str(spec.pipeline.lag_policy),
            stale_weight=t.loss.stale_weight,
        )


@dataclasses.dataclass
class PreparedStep:
    """One optimizer batch, ready to train, and what happened to its samples."""

    micro_batches: list[list[packing.MicroBatch]]
    """Per rank; every rank has the same number."""
    sequences: int
    prompts_trained: list[int]
    prompts_dropped: list[int]
    """Prompt ids whose every sample the lag policy dropped."""
    lag: lag.LagStats
    advantages: advantages.AdvantageStats

    @property
    def empty(self) -> bool:
        """No completion token to train on (everything dropped): do not call `train_step`."""
        return self.micro_batches[0][0].batch_tokens == 0

    def metrics(self) -> dict[str, float]:
        out = {f"lag/{k}": v for k, v in self.lag.as_metrics().items()}
        out |= {f"adv/{k}": v for k, v in self.advantages.as_metrics().items()}
        out["sequences"] = float(self.sequences)
        return out


def prepare(
    groups: Sequence[protocol.RolloutGroup], trainer_version: int, world_size: int, cfg: RLConfig
) -> PreparedStep:
    """Lag policy, advantages and packing for one optimizer batch (pure; same on every rank)."""
    weights, lag_stats = lag.apply(groups, trainer_version, cfg.max_lag, cfg.lag_policy, cfg.stale_weight)
    advs, adv_stats = advantages.compute(groups, cfg.normalize_advantages)
    seqs: list[packing.TrainSequence] = []
    trained: list[int] = []
    dropped: list[int] = []
    for group, ws, adv in zip(groups, weights, advs, strict=True):
        kept = [
            packing.TrainSequence(
                prompt_ids=group.prompt_token_ids,
                completion_ids=s.token_ids,
                behaviour_logprobs=s.logprobs,
                versions=s.versions,
                advantage=a,
                weight=w,
            )
            for s, w, a in zip(group.samples, ws, adv, strict=True)
            if w is not None
        ]
        (trained if kept else dropped).append(group.prompt_id)
        seqs.extend(kept)
    return PreparedStep(
        micro_batches=packing.plan(seqs, world_size, cfg.tokens_per_micro_batch),
        sequences=len(seqs),
        prompts_trained=trained,
        prompts_dropped=dropped,
        lag=lag_stats,
        advantages=adv_stats,
    )


def token_logprobs(model: torch.nn.Module, mb: packing.MicroBatch, temperature: float) -> torch.Tensor:
    """[T] log-probability of each target token under log_softmax(logits / temperature).

    `use_cache=False` is what makes restarting position ids isolate the packed sequences.
    """
    out = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False)
    return sampled_logprobs(out.logits[0], mb.target_ids, temperature)


def sampled_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """[T] log-probability of `targets` under log_softmax(logits / temperature), logits [T, V]."""
    if temperature < sampling.GREEDY_EPS:
        temperature = 1.0
    scaled = logits.float() / temperature
    picked = scaled.gather(-1, targets[:, None])[:, 0]
    result: torch.Tensor = picked - torch.logsumexp(scaled, dim=-1)
    return result


def rl_step(
    model: torch.nn.Module, micro_batch: packing.MicroBatch, cfg: RLConfig
) -> tuple[torch.Tensor, losses.Sums]:
    """Loss to call backward on (already multiplied by `grad_scale`) and additive metric sums."""
    mb = micro_batch
    logprobs = token_logprobs(model, mb, cfg.temperature)
    masked = logprobs.detach()[mb.loss_mask]
    assert torch.isfinite(masked).all(), "non-finite log-probabilities from the model"
    assert torch.isfinite(mb.behaviour_logprobs).all(), "non-finite behaviour log-probabilities"
    inputs = losses.LossInputs(
        logprobs=logprobs,
        behaviour_logprobs=mb.behaviour_logprobs,
        advantages=mb.advantages,
        weights=mb.weights,
        loss_mask=mb.loss_mask,
        normalizer=float(mb.batch_tokens),
    )
    loss, sums = losses.get(cfg.loss.name)(inputs, cfg.loss)
    assert torch.isfinite(loss), f"non-finite loss {float(loss)}"
    sums["version_sum"] = float(mb.versions[mb.loss_mask].double().sum())
    sums["input_tokens"] = float(mb.num_tokens if mb.num_sequences else 0)
    sums["logprob_sum"] = float(masked.double().sum())
    return loss * mb.grad_scale, sums


def _all_reduce_sums(sums: losses.Sums) -> losses.Sums:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return sums
    keys = sorted(sums)
    t = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return dict(zip(keys, t.cpu().tolist(), strict=True))


def train_step(
    engine: base.TrainingEngine, micro_batches: Sequence[packing.MicroBatch], cfg: RLConfig
) -> dict[str, float]:
    """This rank's share of one optimizer batch, then one optimizer step (collective).

    Returns loss/IS/lag metrics over all ranks' tokens, plus the engine's `grad_norm` and `lr`.
    Refuses a batch without a single completion token on any rank (every sample dropped): an
    optimizer step on zero gradients would still move the weights (Adam momentum, weight decay).
    """
    if not micro_batches or micro_batches[0].batch_tokens == 0:
        raise ValueError("empty optimizer batch (no completion tokens on any rank); skip the step")
    version = engine.version
    sums: losses.Sums = {}
    n = len(micro_batches)
    for i, mb in enumerate(micro_batches):
        mb_dev = mb.to(engine.device)
        got = engine.train_micro_batch(
            functools.partial(rl_step, micro_batch=mb_dev, cfg=cfg), last=i == n - 1
        )
        sums = losses.add_sums(sums, got)
    sums = _all_reduce_sums(sums)  # before the step: the delay-compensated one needs the batch's version
    tokens = sums.get("tokens", 0.0)
    out = engine.step(delay_compensation.behaviour_version(sums.get("version_sum", 0.0), tokens, version))
    metrics = losses.summarize(sums)
    metrics["trained_lag_mean"] = version - sums.get("version_sum", 0.0) / tokens if tokens else 0.0
    metrics["trained_tokens"] = tokens
    metrics["input_tokens"] = sums.get("input_tokens", 0.0)
    metrics["logprob_mean"] = sums.get("logprob_sum", 0.0) / tokens if tokens else 0.0
    metrics |= out
    metrics["version"] = float(engine.version)
    assert math.isfinite(metrics["loss"]), "non-finite batch loss"
    return metrics
