"""What a worker's log must show, for tests that read it from `plrl run`'s run directory or from the
node agent's container log files."""

from __future__ import annotations

import re


def assert_joined_with_weights_then_in_flight(log: str) -> None:
    """A generator that joined a running job pulled the current weights before any rollout of its
    was taken, and then received a later version in flight, as a member of the weight-sync group."""
    lines = log.splitlines()
    where = {
        key: next((i for i, line in enumerate(lines) if key in line), None)
        for key in ("pulled full weights v", "first rollout group taken", "in the weight-sync group")
    }
    pulled, delivered, joined = where.values()
    assert pulled is not None and delivered is not None and joined is not None, (where, log[-3000:])
    assert pulled < delivered, log[-3000:]
    v_pulled = int(re.findall(r"pulled full weights v(\d+)", lines[pulled])[0])
    v_in_flight = int(re.findall(r"weights v(\d+) applied in flight", lines[joined])[0])
    assert v_in_flight > v_pulled, (lines[pulled], lines[joined])


def groups_carried_over(log: str) -> list[tuple[int, int]]:
    """(finished while the coordinator was away, delivered to its successor), per restart of it."""
    pattern = r"(\d+) group\(s\) finished while the coordinator was away: (\d+) delivered to its successor"
    return [(int(held), int(delivered)) for held, delivered in re.findall(pattern, log)]
