"""Validation of one submitted `RolloutGroup` against its lease (pure; no locks, no I/O).

Called by `coordinator.Coordinator.submit` outside its lock. Each check maps to the gRPC status a
generator gets back (`Code`): malformed data is INVALID_ARGUMENT; data that is well-formed but
impossible now (a token version newer than the trainer's) is FAILED_PRECONDITION.

This runs for every token the coordinator receives, so the per-token checks exist twice with the
same rules: `check_sample_arrays` (numpy, on the zero-copy views of a decoded message; the RPC path,
then `submit(..., tokens_checked=True)`) and `_check_sample` (C-level builtins on the lists of an
in-process `types.Sample`). A test holds the two to the same verdicts.
"""

from __future__ import annotations

import enum
import math

import numpy
import numpy.typing as npt

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
    tokens_checked: bool = False,
) -> tuple[Code, str] | None:
    """None if `group` is a valid answer to the lease of `prompt`; else (code, reason).

    `tokens_checked`: the per-token arrays already passed `check_sample_arrays` (skip them here).
    """
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
        problem = _check_scalars(s.reward, s.finish_reason)
        if problem is None and not tokens_checked:
            problem = _check_sample(s, current_version, vocab_size)
        if problem is not None:
            code, reason = problem
            return code, f"sample {i}: {reason}"
    return None


def _check_scalars(reward: float, finish_reason: str) -> tuple[Code, str] | None:
    if not math.isfinite(reward):
        return Code.INVALID_ARGUMENT, f"reward {reward} is not finite"
    if finish_reason not in FINISH_REASONS:
        return Code.INVALID_ARGUMENT, f"finish_reason {finish_reason!r} not in {sorted(FINISH_REASONS)}"
    return None


def _lengths(n: int, n_logprobs: int, n_versions: int) -> tuple[Code, str] | None:
    if n_logprobs != n or n_versions != n:
        return Code.INVALID_ARGUMENT, f"{n} tokens but {n_logprobs} logprobs and {n_versions} versions"
    return None


def _newer(version: int, current_version: int) -> tuple[Code, str]:
    return Code.FAILED_PRECONDITION, f"version {version} is newer than the trainer's {current_version}"


def check_sample_arrays(
    token_ids: npt.NDArray[numpy.int32],
    logprobs: npt.NDArray[numpy.float32],
    versions: npt.NDArray[numpy.int32],
    *,
    current_version: int,
    vocab_size: int | None = None,
) -> tuple[Code, str] | None:
    """The per-token rules of `_check_sample`, vectorised (a handful of numpy calls per sample)."""
    n = len(token_ids)
    problem = _lengths(n, len(logprobs), len(versions))
    if problem is not None or n == 0:
        return problem
    if not numpy.isfinite(logprobs).all():
        return Code.INVALID_ARGUMENT, "logprobs hold NaN or infinity"
    if logprobs.max() > 0.0:
        return Code.INVALID_ARGUMENT, "logprobs must be <= 0"
    if n > 1 and (versions[1:] < versions[:-1]).any():
        return Code.INVALID_ARGUMENT, "versions must not decrease along a sample"
    if versions[0] < 0:
        return Code.INVALID_ARGUMENT, f"version {versions[0]} is negative"
    if versions[-1] > current_version:
        return _newer(int(versions[-1]), current_version)
    if token_ids.min() < 0 or (vocab_size is not None and token_ids.max() >= vocab_size):
        return Code.INVALID_ARGUMENT, f"token ids outside [0, {vocab_size})"
    return None


def _check_sample(s: types.Sample, current_version: int, vocab_size: int | None) -> tuple[Code, str] | None:
    n = len(s.token_ids)
    problem = _lengths(n, len(s.logprobs), len(s.versions))
    if problem is not None or n == 0:
        return problem
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
        return _newer(versions[-1], current_version)
    if min(s.token_ids) < 0 or (vocab_size is not None and max(s.token_ids) >= vocab_size):
        return Code.INVALID_ARGUMENT, f"token ids outside [0, {vocab_size})"
    return None
