"""Validation of one submitted `RolloutGroup` against its lease (pure; no locks, no I/O).

Called by `coordinator.Coordinator.submit` outside its lock. Each check maps to the gRPC status a
generator gets back (`protocol.Code`): malformed data is INVALID_ARGUMENT; data that is well-formed but
impossible now (a token version newer than the trainer's) is FAILED_PRECONDITION.

This runs for every token the coordinator receives, so the per-token rules are a handful of numpy
calls per sample on `protocol.Sample`'s arrays (zero-copy views of the message, on the RPC path).
"""

from __future__ import annotations

import math

import numpy

from plrl_workers import protocol

FINISH_REASONS = frozenset({"stop", "length"})
# Far beyond any task's reward scale, far below where squaring it (the group's variance) overflows a
# float64 (~1e154); a reward of 1e200 used to end the whole job in the trainer's advantage step.
MAX_ABS_REWARD = 1e6


def check_group(
    group: protocol.RolloutGroup,
    prompt: protocol.Prompt,
    *,
    samples_per_prompt: int,
    current_version: int,
    vocab_size: int | None = None,
    max_new_tokens: int | None = None,
    max_abs_reward: float = MAX_ABS_REWARD,
) -> tuple[protocol.Code, str] | None:
    """None if `group` is a valid answer to the lease of `prompt`; else (code, reason). The limits
    are inclusive: a sample of exactly `max_new_tokens` tokens, a reward of exactly
    +-`max_abs_reward`, a token id of `vocab_size - 1` and a version equal to `current_version` pass."""
    if group.prompt_id != prompt.prompt_id:
        return (
            protocol.Code.INVALID_ARGUMENT,
            f"prompt_id {group.prompt_id} does not match the lease's {prompt.prompt_id}",
        )
    if tuple(group.prompt_token_ids) != prompt.token_ids:
        return protocol.Code.INVALID_ARGUMENT, "prompt_token_ids differ from the leased prompt's"
    if len(group.samples) != samples_per_prompt:
        return protocol.Code.INVALID_ARGUMENT, f"{len(group.samples)} samples, expected {samples_per_prompt}"
    for i, s in enumerate(group.samples):
        problem = (
            _check_scalars(s.reward, s.finish_reason, max_abs_reward)
            or _check_length(len(s.token_ids), max_new_tokens)
            or _check_tokens(s, current_version, vocab_size)
        )
        if problem is not None:
            code, reason = problem
            return code, f"sample {i}: {reason}"
    return None


def _check_scalars(
    reward: float, finish_reason: str, max_abs_reward: float
) -> tuple[protocol.Code, str] | None:
    if not math.isfinite(reward):
        return protocol.Code.INVALID_ARGUMENT, f"reward {reward} is not finite"
    if abs(reward) > max_abs_reward:
        bound = f"[-{max_abs_reward:g}, {max_abs_reward:g}]"
        return protocol.Code.INVALID_ARGUMENT, f"reward {reward:g} is outside {bound}"
    if finish_reason not in FINISH_REASONS:
        return (
            protocol.Code.INVALID_ARGUMENT,
            f"finish_reason {finish_reason!r} not in {sorted(FINISH_REASONS)}",
        )
    return None


def _check_length(n: int, max_new_tokens: int | None) -> tuple[protocol.Code, str] | None:
    if max_new_tokens is not None and n > max_new_tokens:
        return (
            protocol.Code.INVALID_ARGUMENT,
            f"{n} tokens, more than the job's generation.maxNewTokens={max_new_tokens}",
        )
    return None


def _check_tokens(
    s: protocol.Sample, current_version: int, vocab_size: int | None
) -> tuple[protocol.Code, str] | None:
    """The per-token rules: equal lengths, finite logprobs <= 0, versions non-decreasing within
    [0, current_version], token ids within [0, vocab_size)."""
    n = len(s.token_ids)
    if len(s.logprobs) != n or len(s.versions) != n:
        return (
            protocol.Code.INVALID_ARGUMENT,
            f"{n} tokens but {len(s.logprobs)} logprobs and {len(s.versions)} versions",
        )
    if n == 0:
        return None
    if not numpy.isfinite(s.logprobs).all():
        return protocol.Code.INVALID_ARGUMENT, "logprobs hold NaN or infinity"
    if s.logprobs.max() > 0.0:
        return protocol.Code.INVALID_ARGUMENT, "logprobs must be <= 0"
    versions = s.versions
    if n > 1 and (versions[1:] < versions[:-1]).any():
        return protocol.Code.INVALID_ARGUMENT, "versions must not decrease along a sample"
    if versions[0] < 0:
        return protocol.Code.INVALID_ARGUMENT, f"version {versions[0]} is negative"
    if versions[-1] > current_version:
        return (
            protocol.Code.FAILED_PRECONDITION,
            f"version {versions[-1]} is newer than the trainer's {current_version}",
        )
    if s.token_ids.min() < 0 or (vocab_size is not None and s.token_ids.max() >= vocab_size):
        return protocol.Code.INVALID_ARGUMENT, f"token ids outside [0, {vocab_size})"
    return None
