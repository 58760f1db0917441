"""What of the coordinator survives a restart: a small JSON-able record stored in trainer checkpoints.

`Coordinator.export_state()` produces a `CoordinatorState` dict; `Coordinator(..., state=...)` reads
one back (validated here, since a checkpoint file is external input). Completed prompt ids are kept
as merged inclusive ranges (`IdRanges`), so a run of a million prompts trained in order is one pair.
Prompts that were issued but not finished (leased, re-queued, buffered, in training) are stored in
full and re-queued on restore, so they need not be re-read from the source.

Neighbours: `coordinator/core.py` (the only user), the trainer's checkpoint code (stores the dict).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Literal

import pydantic


class IdRanges:
    """A set of ints stored as sorted, disjoint, non-adjacent inclusive ranges [lo, hi]."""

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []
        self._count = 0
        for lo, hi in ranges:
            self.add_range(lo, hi)

    def __contains__(self, x: int) -> bool:
        i = bisect.bisect_right(self._lo, x) - 1
        return i >= 0 and x <= self._hi[i]

    def __len__(self) -> int:
        return self._count

    def add(self, x: int) -> bool:
        """Add `x`; False if it was already there."""
        if x in self:
            return False
        self.add_range(x, x)
        return True

    def add_range(self, lo: int, hi: int) -> None:
        """Add every int in [lo, hi], merging with overlapping or adjacent ranges."""
        if lo > hi:
            raise ValueError(f"range [{lo}, {hi}] has lo > hi")
        i = bisect.bisect_left(self._hi, lo - 1)  # first range that ends at or after lo - 1
        j = bisect.bisect_right(self._lo, hi + 1)  # ranges [i, j) touch [lo, hi]
        removed = 0
        if i < j:
            lo, hi = min(lo, self._lo[i]), max(hi, self._hi[j - 1])
            removed = sum(self._hi[k] - self._lo[k] + 1 for k in range(i, j))
        self._lo[i:j] = [lo]
        self._hi[i:j] = [hi]
        self._count += hi - lo + 1 - removed

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._lo, self._hi, strict=True))


class PendingPrompt(pydantic.BaseModel):
    """A prompt that was issued and not yet trained or dropped when the state was exported."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    prompt_id: int
    text: str
    answer: str
    token_ids: tuple[int, ...]
    holder: str = pydantic.Field(
        default="",
        description="The generator its lease was with (empty: none). A restored coordinator keeps the "
        "prompt for it a while: it may come back with the group finished (`Coordinator.lease`).",
    )


class CoordinatorState(pydantic.BaseModel):
    """The coordinator's restart record (format 1). Invariant: issued = trained + dropped + len(pending)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    format: Literal[1] = 1
    weight_version: int = pydantic.Field(ge=0, description="Last finished optimizer step's weight version.")
    next_index: int = pydantic.Field(ge=0, description="Items consumed from the prompt source.")
    issued: int = pydantic.Field(ge=0)
    trained: int = pydantic.Field(ge=0)
    dropped_by_lag: int = pydantic.Field(ge=0)
    dropped_in_steps: int = pydantic.Field(
        default=0,
        ge=0,
        description="Of those, dropped from batches that still made a step (they used the budget).",
    )
    completed: list[tuple[int, int]] = pydantic.Field(
        default_factory=list, description="Prompt ids trained or dropped, as inclusive [lo, hi] ranges."
    )
    pending: list[PendingPrompt] = pydantic.Field(default_factory=list)

    @pydantic.model_validator(mode="after")
    def _balanced(self) -> CoordinatorState:
        if self.issued != self.trained + self.dropped_by_lag + len(self.pending):
            raise ValueError(
                f"issued={self.issued} must equal trained={self.trained} + dropped_by_lag="
                f"{self.dropped_by_lag} + len(pending)={len(self.pending)}"
            )
        for lo, hi in self.completed:
            if lo > hi:
                raise ValueError(f"completed: range [{lo}, {hi}] has lo > hi")
        return self
