"""Worker health from what a controller observes: alive, stale, exited, slow. Pure.

A worker that is running but has not renewed its heartbeat since it (re)started is `STARTING`
(it may still be loading its model); one that renewed within `heartbeat.timeoutSeconds` is
`HEALTHY`; one whose last renewal is older is `STALE` (hung, or cut off from the API server).
`slow` compares completion rates among peers: a generator this fraction below its peers' median
is slow (the seed's 15-20% rule).

Neighbours: `policy.decide` (acts on failures), `plrl_operator.status` (the WorkersHealthy
condition), the controllers (build the inputs from Leases or processes).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum

from plrl_api import peers

slow = peers.slow  # the one rule, shared with the coordinator (plrl_api.peers)


class Health(enum.StrEnum):
    STARTING = "starting"
    HEALTHY = "healthy"
    STALE = "stale"
    EXITED = "exited"


@dataclasses.dataclass(frozen=True)
class Beat:
    """One worker's liveness evidence at one moment."""

    name: str
    running: bool
    started: datetime.datetime | None
    """When this incarnation of the worker started (pod creation); None if unknown."""
    renewed: datetime.datetime | None
    """Its last heartbeat (Lease renewTime); None if it never renewed one."""


def classify(beat: Beat, now: datetime.datetime, timeout_s: float) -> Health:
    if not beat.running:
        return Health.EXITED
    # A renewal older than this incarnation belongs to its predecessor and says nothing about it.
    if beat.renewed is None or (beat.started is not None and beat.renewed < beat.started):
        return Health.STARTING
    if (now - beat.renewed).total_seconds() > timeout_s:
        return Health.STALE
    return Health.HEALTHY
