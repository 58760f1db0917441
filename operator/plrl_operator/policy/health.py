"""Worker health from what a controller observes: alive, stale, exited, slow. Pure.

A worker that is running but has not renewed its heartbeat since it (re)started is `STARTING`
(it may still be loading its model) for up to `heartbeat.startupTimeoutSeconds`, then
`STUCK_STARTING` (hung before its first heartbeat); one that renewed within
`heartbeat.timeoutSeconds` is `HEALTHY`; one whose last renewal is older is `STALE` (hung, or cut
off from the API server).
`slow` compares completion rates among peers: a generator this fraction below its peers' median
is slow (the seed's 15-20% rule). `node_lost` says when a node's pods are to be given up on: its
Ready condition has not been True for `heartbeat.timeoutSeconds` (its kubelet is gone, so a pod
there would stay Terminating forever and its StatefulSet would never replace it). `stays_slow`
says when a generator the coordinator has found slow for `failurePolicy.slowGeneratorReplaceSeconds`
without a break is to be replaced (migrating its work was not enough).

Neighbours: `policy.decide` (acts on failures), `plrl_operator.status` (the WorkersHealthy
condition), the controllers (build the inputs from Leases or processes).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum

from plrl_api import peers, records
from plrl_api import spec as spec_mod

slow = peers.slow  # the one rule, shared with the coordinator (plrl_api.peers)


class Health(enum.StrEnum):
    STARTING = "starting"
    STUCK_STARTING = "stuck-starting"
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


def has_beaten(beat: Beat) -> bool:
    """Whether this incarnation has renewed its heartbeat at least once (else it is still starting)."""
    # A renewal older than this incarnation belongs to its predecessor and says nothing about it.
    return beat.renewed is not None and (beat.started is None or beat.renewed >= beat.started)


def classify(
    beat: Beat, now: datetime.datetime, timeout_s: float, startup_timeout_s: float | None = None
) -> Health:
    if not beat.running:
        return Health.EXITED
    if beat.renewed is None or not has_beaten(beat):
        if startup_timeout_s is not None and starting_for(beat, now) > startup_timeout_s:
            return Health.STUCK_STARTING
        return Health.STARTING
    if (now - beat.renewed).total_seconds() > timeout_s:
        return Health.STALE
    return Health.HEALTHY


def starting_for(beat: Beat, now: datetime.datetime) -> float:
    """Seconds since this incarnation started (0 if unknown: it is not judged)."""
    return 0.0 if beat.started is None else max(0.0, (now - beat.started).total_seconds())


def verdict(
    beat: Beat, now: datetime.datetime, heartbeat: spec_mod.HeartbeatSpec, digits: int = 0
) -> str | None:
    """Why a running worker must be replaced for its heartbeat (hung, or hung while starting), or
    None. The one wording for both controllers (`plrl_operator.status`, `local.runner`)."""
    health = classify(beat, now, heartbeat.timeout_seconds, heartbeat.startup_deadline_seconds)
    if health is Health.STALE:
        assert beat.renewed is not None
        silent = (now - beat.renewed).total_seconds()
        return (
            f"no heartbeat for {silent:.{digits}f} s (spec.heartbeat.timeoutSeconds="
            f"{heartbeat.timeout_seconds:g}): hung, stopped or cut off"
        )
    if health is Health.STUCK_STARTING:
        return (
            f"no heartbeat in the {starting_for(beat, now):.{digits}f} s since it started "
            f"(spec.heartbeat.startupTimeoutSeconds={heartbeat.startup_deadline_seconds:g}): "
            "hung while starting"
        )
    return None


@dataclasses.dataclass(frozen=True)
class NodeReadiness:
    """A node's Ready condition as the API server last said it."""

    status: str | None
    """"True", "False", "Unknown" (the node lifecycle controller lost its kubelet); None: no condition."""
    since: datetime.datetime | None
    """Its lastTransitionTime."""
    reason: str = ""


def node_lost(node: NodeReadiness, now: datetime.datetime, timeout_s: float) -> float | None:
    """Seconds the node has not been Ready, once that is over `timeout_s`; else None (Ready, not
    long enough, or nothing known: a node without a condition is not judged)."""
    if node.status in (None, "True") or node.since is None:
        return None
    down = (now - node.since).total_seconds()
    return down if down > timeout_s else None


def stays_slow(
    report: records.SlowGenerator,
    reported_at: datetime.datetime,
    started: datetime.datetime | None,
    policy: spec_mod.FailurePolicySpec,
) -> str | None:
    """Why the generator of `report` (rank 0's, renewed at `reported_at`) is to be replaced, or
    None. Only the process that was judged slow is: one that started after its slow spell began
    (its replacement, being judged afresh) is not."""
    if report.slow_for_seconds < policy.slow_generator_replace_seconds:
        return None
    since = reported_at - datetime.timedelta(seconds=report.slow_for_seconds)
    if started is not None and started > since:
        return None
    return (
        f"for {report.slow_for_seconds:.0f} s: {report.rate:.2f} rollout groups/s against its peers' "
        f"median {report.peers_median:.2f} (spec.failurePolicy.slowGeneratorThreshold="
        f"{policy.slow_generator_threshold:g}, slowGeneratorReplaceSeconds="
        f"{policy.slow_generator_replace_seconds:g}); {report.migrated} of its leases migrated meanwhile"
    )
