"""The job's lifecycle as an explicit state machine: the Phase enum and its transition table.

`next_phase(current, observed)` is the only place a phase is decided; `status.compute_status`
calls it and `handlers` never sets a phase itself. The table `ALLOWED` lists every transition the
operator may make, and `tests/operator/test_phases.py` walks all phases against all kinds of
observation to prove `next_phase` never leaves it.

Neighbours: `plrl_operator.status` (builds the `Observed` summary and the status object).
"""

from __future__ import annotations

import dataclasses
import enum


class Phase(enum.StrEnum):
    PENDING = "Pending"  # children created, pods not yet scheduled (or unschedulable)
    STARTING = "Starting"  # pods scheduled, not all ready
    RUNNING = "Running"  # every desired pod ready with the current spec
    SCALING = "Scaling"  # a spec change (I, image, ...) is rolling into the StatefulSets
    RECOVERING = "Recovering"  # was running, a pod is missing or not ready without a spec change
    SUCCEEDED = "Succeeded"  # the trainers reported the last step (policy.decide: Finish)
    FAILED = "Failed"  # a worker failed with the restart budget used up (policy.decide: Fail)
    SUSPENDED = "Suspended"  # spec.suspend: every StatefulSet at zero


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED})
_ACTIVE = frozenset({Phase.RUNNING, Phase.SCALING, Phase.RECOVERING})

# Every transition the operator may make; staying in the same phase is always allowed.
ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.STARTING, Phase.RUNNING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}),
    Phase.STARTING: frozenset({Phase.PENDING, Phase.RUNNING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}),
    Phase.RUNNING: frozenset(
        {Phase.SCALING, Phase.RECOVERING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}
    ),
    Phase.SCALING: frozenset(
        {Phase.RUNNING, Phase.RECOVERING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}
    ),
    Phase.RECOVERING: frozenset(
        {Phase.RUNNING, Phase.SCALING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}
    ),
    Phase.SUSPENDED: frozenset({Phase.PENDING, Phase.STARTING, Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED}),
    Phase.SUCCEEDED: frozenset(),
    Phase.FAILED: frozenset(),
}


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the operator saw of a job's children, reduced to the facts phases depend on."""

    suspended: bool = False
    """spec.suspend is true."""
    desired_pods: int = 0
    """Generator plus trainer pods the spec asks for (0 while suspended)."""
    scheduled_pods: int = 0
    """Pods bound to a node."""
    ready_pods: int = 0
    """Pods Ready with the StatefulSets' current revision."""
    live_pods: int = 0
    """Pods that exist at all (any revision, any state)."""
    rolled_out: bool = True
    """Both StatefulSets report the current generation, replicas and revision."""
    unschedulable: bool = False
    """At least one pod was rejected by the scheduler (e.g. too few GPUs)."""
    succeeded: bool = False
    """The policy decided the job succeeded: trainer rank 0 reported the last step (`policy.decide`)."""
    failed: bool = False
    """The policy decided the job failed: a worker failed with the restart budget used up."""


def next_phase(current: Phase | None, obs: Observed) -> Phase:
    """The phase after seeing `obs`; always `current` or a member of `ALLOWED[current]`."""
    cur = current or Phase.PENDING
    if cur in TERMINAL:
        return cur
    # Outcomes come from the policy, which only trusts a report of the current pods (`status`), so
    # they hold from any phase: a job can finish before the operator saw all its pods Ready.
    if obs.failed:
        return Phase.FAILED
    if obs.succeeded:
        return Phase.SUCCEEDED
    if obs.suspended:
        return Phase.SUSPENDED
    all_ready = obs.desired_pods > 0 and obs.ready_pods >= obs.desired_pods and obs.rolled_out
    if all_ready:
        return Phase.RUNNING
    if cur in _ACTIVE:
        # A running job that is not fully ready: either a change is rolling out, or something broke.
        return Phase.RECOVERING if obs.rolled_out else Phase.SCALING
    # Not yet running (new, or resuming from Suspended).
    if obs.unschedulable or obs.scheduled_pods == 0:
        return Phase.PENDING
    return Phase.STARTING
