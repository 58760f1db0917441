"""The autoscaler over a running job: rate samples in, at most one change of I out per look.

`policy.autoscaler.decide` is a pure function of an `Observation`; this keeps what it needs between
looks: the rate samples (one per optimizer step, `policy.rates.sample`), the autoscaler's state,
the changes made, and what the last change cost. Both controllers drive it the same way: the
operator's timer from the workers' Leases (`plrl_operator.autoscaling`), `plrl run` from the step
records and heartbeat files (`local.autoscaling`).

Steps trained again after a change (the trainers resume from their latest checkpoint) are not fed
twice: only steps above the highest one fed so far are, which keeps the policy's step clock
(cadence, cool-down) moving forward only.

A change's cost is timed from when it was carried out until training passes the step it had
reached then, in whatever clock the caller uses (monotonic seconds locally, wall-clock seconds
on the cluster, where an operator restart must not lose it).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from plrl_operator.policy import autoscaler, rates, types

SAMPLES_KEPT = 500
LOOKS_KEPT = 50  # decisions kept in `looks`: enough to say why I did (not) move over a run's end


@dataclasses.dataclass
class AutoscaleLoop:
    policy: autoscaler.Policy
    state: types.AutoscalerState = dataclasses.field(default_factory=types.AutoscalerState)
    samples: collections.deque[types.RateSample] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=SAMPLES_KEPT)
    )
    changes: list[types.Decision] = dataclasses.field(default_factory=list)
    made_at: list[float] = dataclasses.field(default_factory=list)
    """When each change was made, in the caller's clock (seconds)."""
    cost_s: float | None = None
    """What the last change cost: seconds until training passed the step it had reached."""
    timing: tuple[float, int] | None = None
    """(when, step reached) of a change whose cost is still being timed."""
    last: types.Decision | None = None
    looks: collections.deque[types.Decision] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=LOOKS_KEPT)
    )
    """What the latest looks that decided anything said, changes or not: why I did (not) move."""
    high_water: int = 0
    """The highest step fed so far."""
    looked_at: int = 0
    """`high_water` at the last look: a look without new steps decides nothing (a reversal needs
    two looks at new rates, not two ticks of a timer)."""

    def feed(
        self,
        step: int,
        generators: int,
        generator_capacities: Sequence[float | None],
        trainer_capacity: float | None,
    ) -> None:
        """The rates reported for optimizer `step` (ignored unless it is a step not fed yet)."""
        if step <= self.high_water:
            return
        s = rates.sample(step, generators, generator_capacities, trainer_capacity)
        if s is not None:
            self.samples.append(s)
        self.high_water = step

    def trained_to(self, step: int, now: float) -> None:
        """Training is at `step` at time `now`: the end of the last change's cost, once past it."""
        if self.timing is not None and step > self.timing[1]:
            self.cost_s = now - self.timing[0]
            self.timing = None

    def look(self, generators: int, step_seconds: float | None) -> types.Decision | None:
        """The change of I to make now, if any (`step_seconds`: recent time per optimizer step).

        The two shells estimate `step_seconds` differently because they see different things:
        `plrl run` reads every step's own duration from the trainer's records and takes the median
        of the last ten (robust to one step that waited on a checkpoint); the operator only sees
        the step counter in the heartbeat Leases at each timer tick, so it takes the mean over the
        (time, step) pairs seen since the last change."""
        if self.high_water == self.looked_at:
            return None
        self.looked_at = self.high_water
        obs = types.Observation(self.high_water, generators, tuple(self.samples), step_seconds, self.cost_s)
        self.last = autoscaler.decide(self.policy, self.state, obs)
        self.looks.append(self.last)
        self.state = self.last.state
        if not self.last.changed:
            return None
        self.changes.append(self.last)
        return self.last

    def applied(self, when: float, reached: int) -> None:
        """The last change was carried out at `when` with training at step `reached`: time it until
        training passes that (or the highest step fed, if that is further)."""
        self.made_at.append(round(when, 3))
        self.timing = (when, max(self.high_water, reached))
