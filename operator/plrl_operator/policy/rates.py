"""The autoscaler's rate samples, built from what the workers report about themselves.

Each worker reports its *capacity*: completion tokens per second of the time it was working
(`records.WorkerReport.capacity_tokens_per_second`; generators over their metrics window, trainer
rank 0 for the last optimizer step of all ranks). One sample per optimizer step adds the
generators' capacities up; a generator that has not measured one yet (it has just started, or has
not decoded since its window began) makes the sample incomplete, and an incomplete sample is left
out rather than guessed: the autoscaler only counts rates measured at the current I.

Pure; callers: the local runner (`local.autoscaling`) and, later, the operator's timer.
Neighbours: `policy.autoscaler` (the consumer), `plrl_api.records` (the reports).
"""

from __future__ import annotations

from collections.abc import Sequence

from plrl_operator.policy import types


def sample(
    step: int,
    generators: int,
    generator_capacities: Sequence[float | None],
    trainer_capacity: float | None,
) -> types.RateSample | None:
    """The sample for optimizer `step` at I = `generators` accelerators, or None if a worker's
    capacity is missing (or not positive: a generator that decoded nothing measured nothing)."""
    if trainer_capacity is None or trainer_capacity <= 0 or not generator_capacities:
        return None
    if any(c is None or c <= 0 for c in generator_capacities):
        return None
    total = sum(c for c in generator_capacities if c is not None)
    return types.RateSample(step, generators, total, trainer_capacity)
