"""The operator's autoscaler: one `policy.autoscale_loop.AutoscaleLoop` per job, fed from Leases.

Each timer tick reads what the current pods report (`status.capacities`: trainer rank 0's step
and capacity, each generator pod's capacity) and feeds a sample when the step moved. What must
survive an operator restart (the policy's state, the change being timed, its cost) is written to
`status.autoscaler` before a change is carried out, so a restarted operator neither repeats nor
forgets one; the samples are not (a restarted operator waits for a few new steps, nothing worse).

Neighbours: `handlers` (carries a change out: status, StatefulSets, the trainer group),
`status.capacities` (the reading), `policy.autoscaler` (the rule).
"""

from __future__ import annotations

import collections
import dataclasses

from plrl_api import plan
from plrl_api import spec as spec_mod
from plrl_operator import status
from plrl_operator.policy import autoscale_loop, autoscaler, types

_STEP_TIMES_KEPT = 11  # ten step intervals: the step time the cost/benefit gate weighs against


@dataclasses.dataclass
class JobAutoscaler:
    loop: autoscale_loop.AutoscaleLoop
    seen: collections.deque[tuple[float, int]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=_STEP_TIMES_KEPT)
    )
    """(unix time, step) whenever a new step was seen."""
    saved: status.AutoscalerStatus = dataclasses.field(default_factory=status.AutoscalerStatus)
    """What status held when this operator started looking (earlier changes are counted there)."""

    @classmethod
    def restore(
        cls, spec: spec_mod.JobSpec, saved: status.AutoscalerStatus | None, step: int
    ) -> JobAutoscaler:
        """Start from what status remembers; steps up to `step` are taken as fed (their rates are gone)."""
        loop = autoscale_loop.AutoscaleLoop(autoscaler.policy_for_job(spec))
        if saved is not None:
            loop.state = types.AutoscalerState.from_dict(saved.state)
            loop.cost_s = saved.last_change_cost_seconds
            if saved.timing_since is not None and saved.timing_step is not None:
                loop.timing = (saved.timing_since, saved.timing_step)
        loop.high_water = loop.looked_at = step
        return cls(loop, saved=saved or status.AutoscalerStatus())

    def step_seconds(self) -> float | None:
        if len(self.seen) < 2:
            return None
        (t0, s0), (t1, s1) = self.seen[0], self.seen[-1]
        return (t1 - t0) / (s1 - s0) if s1 > s0 else None

    def look(self, pod_plan: plan.PodPlan, caps: status.Capacities, now: float) -> types.Decision | None:
        """Feed what the pods report now; the change of I to make, if any."""
        self.loop.trained_to(caps.step, now)
        if caps.step > self.loop.high_water:
            self.seen.append((now, caps.step))
        self.loop.feed(caps.step, pod_plan.generator_gpus, caps.generators, caps.trainers)
        return self.loop.look(pod_plan.generator_gpus, self.step_seconds())

    def applied(self, now: float, reached: int) -> None:
        self.loop.applied(now, reached)
        self.seen.clear()  # steps trained again after the restart say nothing about the new I's pace

    def to_status(self) -> status.AutoscalerStatus:
        last = self.loop.changes[-1] if self.loop.changes else None
        timing = self.loop.timing
        return status.AutoscalerStatus(
            state=self.loop.state.to_dict(),
            changes=self.saved.changes + len(self.loop.changes),
            last_change=self.saved.last_change if last is None else describe(last),
            last_change_cost_seconds=self.loop.cost_s,
            timing_since=None if timing is None else timing[0],
            timing_step=None if timing is None else timing[1],
        )


def describe(d: types.Decision) -> str:
    """A change as its Event and `status.autoscaler.lastChange` say it."""
    return f"I {d.previous} -> {d.generators} at step {d.step}: {d.reason}"
