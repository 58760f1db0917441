"""Reward functions: the built-in verifiers and loading a user's `package.module:function`.

A reward function takes `(prompt, completion, answer)` as text (the completion without EOS) and
returns a finite float; `score` enforces that, because one NaN reward poisons a whole baseline
group and, through the gradient, the model. Every error names the spec field `task.reward` so a
user knows which line of the job file to fix; `load` runs before any worker process starts.

Neighbours: `tasks/base.py` (tasks and their default reward), the generator (calls `score` for
each finished sample), `plrl_api.spec.TaskSpec.reward` (the syntax, checked there).
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from collections.abc import Callable

RewardFn = Callable[[str, str, str], float]


class RewardError(ValueError):
    """A reward function that cannot be loaded or returned an unusable value."""


def exact_match(prompt: str, completion: str, answer: str) -> float:
    """1.0 if the completion equals the answer (surrounding whitespace ignored), else 0.0."""
    return 1.0 if completion.strip() == answer.strip() else 0.0


def digit_match(prompt: str, completion: str, answer: str) -> float:
    """Partial credit: the fraction of character positions that agree, over the longer length.

    Exact answers get 1.0; every wrong or missing character and every extra one costs the same,
    so a longer guess is never a free lottery ticket. An empty answer is matched only by an empty
    completion. Denser than `exact_match`, which helps a weak model find a gradient.
    """
    c, a = completion.strip(), answer.strip()
    width = max(len(c), len(a))
    if width == 0:
        return 1.0
    return sum(x == y for x, y in zip(c, a, strict=False)) / width


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "digit_match": digit_match,
}


def load(ref: str) -> RewardFn:
    """The reward named by `task.reward`: `builtin:<name>` or `package.module:function`."""
    if ref.startswith("builtin:"):
        name = ref.removeprefix("builtin:")
        if name not in BUILTIN_REWARDS:
            known = ", ".join(f"builtin:{n}" for n in sorted(BUILTIN_REWARDS))
            raise RewardError(f"task.reward: unknown builtin reward {ref!r} (known: {known})")
        return BUILTIN_REWARDS[name]
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise RewardError(f"task.reward: {ref!r} must be 'builtin:<name>' or 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise RewardError(f"task.reward: cannot import module {module_name!r} for {ref!r}: {err}") from None
    except Exception as err:  # a user module that fails at import time
        raise RewardError(
            f"task.reward: importing module {module_name!r} for {ref!r} raised {type(err).__name__}: {err}"
        ) from None
    if not hasattr(module, attr):
        raise RewardError(f"task.reward: module {module_name!r} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise RewardError(f"task.reward: {ref!r} is a {type(fn).__name__}, not a function")
    _check_signature(ref, fn)
    checked: RewardFn = fn
    return checked


def _check_signature(ref: str, fn: Callable[..., object]) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # some builtins and C callables have no introspectable signature; trust them
    try:
        sig.bind("prompt", "completion", "answer")
    except TypeError as err:
        raise RewardError(
            f"task.reward: {ref!r} has signature {sig}; it must accept three positional "
            f"arguments (prompt, completion, answer): {err}"
        ) from None


def score(fn: RewardFn, prompt: str, completion: str, answer: str) -> float:
    """Call a reward function and return its value as a float, refusing anything non-finite."""
    value = fn(prompt, completion, answer)
    name = getattr(fn, "__qualname__", repr(fn))
    if not isinstance(value, numbers.Real):
        raise RewardError(
            f"task.reward: {name} returned {type(value).__name__} {value!r} for completion "
            f"{completion!r}; it must return a float"
        )
    out = float(value)
    if not math.isfinite(out):
        raise RewardError(
            f"task.reward: {name} returned {out} for completion {completion!r}; rewards must be finite"
        )
    return out
