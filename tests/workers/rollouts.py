"""Rollout groups for tests that feed a coordinator by hand (a generator's output, made up)."""

from __future__ import annotations

from plrl_workers import protocol

G = 2
"""Samples per prompt in these tests."""


def sample(n: int = 3, version: int = 0, reward: float = 1.0) -> protocol.Sample:
    return protocol.Sample(
        token_ids=[5] * n, logprobs=[-0.5] * n, versions=[version] * n, reward=reward, finish_reason="stop"
    )


def group_for(lease: protocol.Lease, generator: str | None = None, version: int = 0) -> protocol.RolloutGroup:
    """G samples answering `lease`, from its generator unless `generator` says otherwise."""
    return protocol.RolloutGroup(
        lease_id=lease.lease_id,
        prompt_id=lease.prompt.prompt_id,
        prompt_token_ids=list(lease.prompt.token_ids),
        samples=[sample(version=version) for _ in range(G)],
        generator_id=generator or lease.generator_id,
    )
