"""Waiting on observable state instead of sleeping: `eventually(check)` polls until `check()` holds.

A test that sleeps a fixed time and then asserts is either slow (the sleep is long enough for a
loaded machine) or flaky (it is not); polling a condition a user could observe (a counter, a file,
a thread that ended) is both fast and bounded. Neighbours: the tests that wait on workers, RPC
servers and processes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def eventually(
    check: Callable[[], T | None], *, timeout_s: float = 30.0, what: str, interval_s: float = 0.02
) -> T:
    """`check()`'s first truthy result; fails the test naming `what` (and the last result) after
    `timeout_s`. Return None (or anything falsy) for "not yet"."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what} (last: {result!r})")
        time.sleep(interval_s)
