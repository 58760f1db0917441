"""Which worker is slow against its peers: the seed's 15-20% rule. Pure, shared by both halves.

The coordinator (trainer rank 0) compares generators' completion rates to migrate part of a slow
one's work to the others (`plrl_workers.coordinator.core.Coordinator.migrate_from_slow`); the
operator's policy (`plrl_operator.policy.health`) applies the same rule to heartbeat figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence


def slow(rates: Mapping[str, float], threshold: float) -> list[str]:
    """Names whose rate is more than `threshold` below the median of the *others'* rates.

    Needs at least two workers; a worker is only compared with peers that report a rate.
    """
    out = []
    for name, rate in sorted(rates.items()):
        peers: Sequence[float] = [r for n, r in rates.items() if n != name]
        if not peers:
            continue
        median = statistics.median(peers)
        if median > 0 and rate < (1.0 - threshold) * median:
            out.append(name)
    return out
