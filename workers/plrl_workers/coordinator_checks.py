"""Validation of one submitted `RolloutGroup` against its lease (pure; no locks, no I/O).

Called by `coordinator.Coordinator.submit` outside its lock. Each check maps to the gRPC status a
generator gets back (`Code`): malformed data is INVALID_ARGUMENT; data that is well-formed but
impossible now (a token version newer than the trainer's) is FAILED_PRECONDITION. Written with
C-level builtins (`sum`, `max`, `sorted`) rather than Python loops over tokens: this runs for every
token the coordinator receives.
"""

from __future__ import annotations

import enum
import math

from plrl_workers import types

FINISH_REASONS = frozenset({"stop", "length"})


class Code(enum.IntEnum):
    """Outcome of a coordinator call; numbers are gRPC's (`google.rpc.Code`), names too."""

    OK = 0
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    UNAVAILABLE = 14


def check_group(
    group: types.RolloutGroup,
    prompt: types.Prompt,
    *,
    samples_per_prompt: int,
    current_version: int,
    vocab_size: int | None = None,
) -> tuple[Code, str] | None:
    """None if `group` is a valid answer to the lease of `prompt`; else (code, reason)."""
    if group.prompt_id != prompt.prompt_id:
        return (
            Code.INVALID_ARGUMENT,
            f"prompt_id {group.prompt_id} does not match the lease's {prompt.prompt_id}",
        )
    if tuple(group.prompt_token_ids) != prompt.token_ids:
        return Code.INVALID_ARGUMENT, "prompt_token_ids differ from the leased prompt's"
    if len(group.samples) != samples_per_prompt:
        return Code.INVALID_ARGUMENT, f"{len(group.samples)} samples, expected {samples_per_prompt}"
    for i, s in enumerate(group.samples):
        problem = _check_sample(s, current_version, vocab_size)
        if problem is not None:
            code, reason = problem
            return code, f"sample {i}: {reason}"
    return None


def _check_sample(s: types.Sample, current_version: int, vocab_size: int | None) -> tuple[Code, str] | None:
    n = len(s.token_ids)
    if len(s.logprobs) != n or len(s.versions) != n:
        return (
            Code.INVALID_ARGUMENT,
            f"{n} tokens but {len(s.logprobs)} logprobs and {len(s.versions)} versions",
        )
    if not math.isfinite(s.reward):
        return Code.INVALID_ARGUMENT, f"reward {s.reward} is not finite"
    if s.finish_reason not in FINISH_REASONS:
        return Code.INVALID_ARGUMENT, f"finish_reason {s.finish_reason!r} not in {sorted(FINISH_REASONS)}"
    if n == 0:
        return None
    # A NaN or an infinity anywhere makes the sum non-finite; max() then catches positive values.
    if not math.isfinite(sum(s.logprobs)):
        return Code.INVALID_ARGUMENT, "logprobs hold NaN or infinity"
    if max(s.logprobs) > 0.0:
        return Code.INVALID_ARGUMENT, "logprobs must be <= 0"
    versions = s.versions if isinstance(s.versions, list) else list(s.versions)
    if versions != sorted(versions):
        return Code.INVALID_ARGUMENT, "versions must not decrease along a sample"
    if versions[0] < 0:
        return Code.INVALID_ARGUMENT, f"version {versions[0]} is negative"
    if versions[-1] > current_version:
        return (
            Code.FAILED_PRECONDITION,
            f"version {versions[-1]} is newer than the trainer's {current_version}",
        )
    if min(s.token_ids) < 0 or (vocab_size is not None and max(s.token_ids) >= vocab_size):
        return Code.INVALID_ARGUMENT, f"token ids outside [0, {vocab_size})"
    return None
