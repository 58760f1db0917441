"""The phase state machine: every (phase, observation) pair stays inside the transition table.

Cases: an exhaustive walk over all phases and a grid of observations (suspend, failure, success,
scheduling, readiness, roll-out) checks `next_phase` only makes allowed transitions; terminal
phases never change; then the transitions a user sees, one by one.
"""

from __future__ import annotations

import itertools

import pytest

from plrl_operator import phases
from plrl_operator.phases import Observed, Phase


def _grid() -> list[Observed]:
    out = []
    for suspended, failed, succeeded, unschedulable, rolled_out in itertools.product([False, True], repeat=5):
        for desired, scheduled, ready in itertools.product([0, 4], [0, 2, 4], [0, 2, 4]):
            if ready > scheduled:
                continue
            out.append(
                Observed(
                    suspended=suspended,
                    desired_pods=0 if suspended else desired,
                    scheduled_pods=scheduled,
                    ready_pods=ready,
                    live_pods=scheduled,
                    rolled_out=rolled_out,
                    unschedulable=unschedulable,
                    succeeded=succeeded,
                    failed=failed,
                )
            )
    return out


GRID = _grid()


def test_table_covers_every_phase() -> None:
    assert set(phases.ALLOWED) == set(Phase)
    for src, targets in phases.ALLOWED.items():
        assert src not in targets, "self-transitions are implicit"
        assert targets <= set(Phase)


@pytest.mark.parametrize("current", [None, *Phase])
def test_next_phase_never_leaves_the_table(current: Phase | None) -> None:
    src = current or Phase.PENDING
    reached = set()
    for obs in GRID:
        nxt = phases.next_phase(current, obs)
        assert nxt == src or nxt in phases.ALLOWED[src], (src, obs, nxt)
        reached.add(nxt)
    if src not in phases.TERMINAL:
        assert Phase.FAILED in reached and Phase.SUSPENDED in reached


@pytest.mark.parametrize("terminal", sorted(phases.TERMINAL))
def test_terminal_phases_are_final(terminal: Phase) -> None:
    assert {phases.next_phase(terminal, obs) for obs in GRID} == {terminal}


def test_every_allowed_transition_is_reachable() -> None:
    for src, targets in phases.ALLOWED.items():
        reached = {phases.next_phase(src, obs) for obs in GRID}
        assert targets <= reached, (src, targets - reached)


def _obs(**kw: object) -> Observed:
    base: dict[str, object] = {"desired_pods": 4, "rolled_out": True}
    base.update(kw)
    return Observed(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("current", "obs", "expected"),
    [
        (None, _obs(), Phase.PENDING),  # nothing scheduled yet
        (Phase.PENDING, _obs(unschedulable=True, scheduled_pods=2), Phase.PENDING),  # too few GPUs
        (Phase.PENDING, _obs(scheduled_pods=4, ready_pods=1), Phase.STARTING),
        (Phase.STARTING, _obs(scheduled_pods=4, ready_pods=4), Phase.RUNNING),
        (Phase.PENDING, _obs(scheduled_pods=4, ready_pods=4), Phase.RUNNING),
        (Phase.STARTING, _obs(scheduled_pods=4, ready_pods=4, rolled_out=False), Phase.STARTING),
        (Phase.RUNNING, _obs(scheduled_pods=4, ready_pods=3, rolled_out=False), Phase.SCALING),  # edit
        (Phase.RUNNING, _obs(scheduled_pods=3, ready_pods=3), Phase.RECOVERING),  # a pod died
        (Phase.RECOVERING, _obs(scheduled_pods=4, ready_pods=4), Phase.RUNNING),
        (Phase.SCALING, _obs(scheduled_pods=4, ready_pods=4), Phase.RUNNING),
        (Phase.RUNNING, _obs(suspended=True, desired_pods=0), Phase.SUSPENDED),
        (Phase.SUSPENDED, _obs(), Phase.PENDING),  # resumed, pods not back yet
        (Phase.SUSPENDED, _obs(scheduled_pods=4, ready_pods=4), Phase.RUNNING),
        (Phase.RUNNING, _obs(scheduled_pods=4, ready_pods=4, succeeded=True), Phase.SUCCEEDED),
        # The policy's outcome holds from any phase (status only trusts reports of current pods).
        (Phase.STARTING, _obs(scheduled_pods=4, ready_pods=2, succeeded=True), Phase.SUCCEEDED),
        (Phase.SUSPENDED, _obs(succeeded=True, suspended=True), Phase.SUCCEEDED),
        (Phase.RUNNING, _obs(failed=True), Phase.FAILED),
    ],
)
def test_user_visible_transitions(current: Phase | None, obs: Observed, expected: Phase) -> None:
    assert phases.next_phase(current, obs) is expected
