"""`rl.step.prepare`: lag policy + advantages + packing for one optimizer batch, the prompt
accounting it reports (trained vs dropped by the lag policy), and the spec -> RLConfig mapping."""

from __future__ import annotations

import pytest
import torch

from plrl_api import spec
from plrl_workers import protocol
from plrl_workers.engines import training
from plrl_workers.rl import lag, step


def _group(prompt_id: int, rewards: list[float], versions: list[list[int]]) -> protocol.RolloutGroup:
    samples = [
        protocol.Sample(
            token_ids=[10 + i] * len(v), logprobs=[-1.0] * len(v), versions=v, reward=r, finish_reason="stop"
        )
        for i, (r, v) in enumerate(zip(rewards, versions, strict=True))
    ]
    return protocol.RolloutGroup(f"lease-{prompt_id}", prompt_id, [1, 2, 3], samples, "gen-0")


GROUPS = [
    _group(7, [1.0, 0.0], [[5, 6], [6, 6, 6]]),  # lags 1 and 0 at version 6: trained
    _group(8, [0.0, 0.0], [[2], [3, 4]]),  # lags 4 and 3 > maxLag 2: dropped entirely
    _group(9, [1.0, 0.0], [[6], [1, 6]]),  # one sample dropped (lag 5), the other trained
]


def test_prepare_applies_the_lag_policy_and_accounts_for_every_prompt() -> None:
    cfg = step.RLConfig(tokens_per_micro_batch=16, max_lag=2, lag_policy=lag.DROP)
    prep = step.prepare(GROUPS, trainer_version=6, world_size=2, cfg=cfg)
    assert prep.prompts_trained == [7, 9] and prep.prompts_dropped == [8]
    assert prep.sequences == 3
    assert (prep.lag.samples_dropped, prep.lag.groups_dropped) == (3, 1)
    assert prep.advantages.zero_advantage_groups == 1
    mbs = [mb for rank in prep.micro_batches for mb in rank]
    assert len(prep.micro_batches[0]) == len(prep.micro_batches[1])
    assert sum(mb.loss_tokens for mb in mbs) == 2 + 3 + 1 == mbs[0].batch_tokens
    # The kept sample of prompt 9 keeps its leave-one-out advantage from both rewards: 1 - 0.
    advs = torch.cat([mb.advantages[mb.loss_mask] for mb in mbs])
    assert sorted(advs.tolist()) == [-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]
    assert prep.metrics()["lag/samples_dropped"] == 3.0 and not prep.empty


def test_downweighted_samples_carry_their_weight_into_the_micro_batch() -> None:
    cfg = step.RLConfig(tokens_per_micro_batch=64, max_lag=2, lag_policy=lag.DOWNWEIGHT)
    prep = step.prepare(GROUPS[1:2], trainer_version=6, world_size=1, cfg=cfg)
    (mb,) = prep.micro_batches[0]
    assert sorted(mb.weights[mb.loss_mask].tolist()) == [0.25, 0.5, 0.5]
    assert prep.prompts_dropped == [] and prep.lag.samples_downweighted == 2


def test_stale_samples_carry_the_stale_weight_into_the_micro_batch() -> None:
    cfg = step.RLConfig(tokens_per_micro_batch=64, max_lag=2, stale_weight=0.3)
    prep = step.prepare(GROUPS[0:1], trainer_version=6, world_size=1, cfg=cfg)
    (mb,) = prep.micro_batches[0]
    # Prompt 7: its 2-token sample has lag 1, the 3-token one lag 0 (the batch's freshest).
    assert sorted(mb.weights[mb.loss_mask].tolist()) == pytest.approx([0.3, 0.3, 1.0, 1.0, 1.0])
    assert prep.metrics()["lag/samples_stale"] == 1.0


def test_an_all_dropped_batch_is_empty_and_refused() -> None:
    prep = step.prepare(GROUPS[1:2], trainer_version=6, world_size=2, cfg=step.RLConfig(max_lag=0))
    assert prep.empty and prep.prompts_dropped == [8]
    with pytest.raises(ValueError, match="empty optimizer batch"):
        step.train_step(None, prep.micro_batches[0], step.RLConfig())  # type: ignore[arg-type]


def test_configs_are_read_from_the_job_spec() -> None:
    job = spec.JobSpec.model_validate(
        {
            "model": {"name": "builtin:tiny"},
            "generation": {"temperature": 0.7, "maxNewTokens": 64, "samplesPerPrompt": 4},
            "training": {
                "backend": "torch",
                "batchSize": 16,
                "tokensPerMicroBatch": 512,
                "gradientClipping": 0.0,
                "loss": {
                    "name": "reinforce",
                    "isClamp": 3.0,
                    "normalizeAdvantages": True,
                    "staleWeight": 0.3,
                    "behaviourKL": 0.05,
                },
            },
            "pipeline": {"maxLag": 4, "lagPolicy": "downweight"},
        }
    )
    rl = step.RLConfig.from_spec(job)
    assert (rl.loss.name, rl.loss.is_clamp, rl.temperature) == ("reinforce", 3.0, 0.7)
    assert (rl.normalize_advantages, rl.tokens_per_micro_batch, rl.max_lag, rl.lag_policy) == (
        True,
        512,
        4,
        "downweight",
    )
    assert (rl.stale_weight, rl.loss.behaviour_kl) == (0.3, 0.05)
    eng = training.TrainEngineConfig.from_spec(job, "/models/x")
    assert (eng.backend, eng.gradient_clipping, eng.model_path) == ("torch", 0.0, "/models/x")
