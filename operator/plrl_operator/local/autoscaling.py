"""`plrl run`'s autoscaler: one rate sample per trained step, `policy.autoscaler.decide` on them.

The trainer's capacity comes from each step's record (completion tokens over the step's busy
seconds); the generators' from their heartbeat files (tokens per second spent decoding). A
resize restarts the trainers from their latest checkpoint, so the steps after it are trained
again; samples of steps at or below the highest step already seen are skipped, which keeps the
policy's step clock (cadence, cool-down) moving forward only.

Neighbours: `local.runner` (reads the files, applies the decisions), `policy.rates`,
`policy.autoscaler`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
from collections.abc import Sequence

from plrl_api import records
from plrl_api import spec as spec_mod
from plrl_operator.policy import autoscaler, rates, types

DECISIONS_FILE = "autoscale.json"
"""In the run directory: every change the autoscaler made, with its reason."""
_SAMPLES_KEPT = 500


@dataclasses.dataclass
class LocalAutoscaler:
    policy: autoscaler.Policy
    state: types.AutoscalerState = dataclasses.field(default_factory=types.AutoscalerState)
    samples: collections.deque[types.RateSample] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=_SAMPLES_KEPT)
    )
    changes: list[types.Decision] = dataclasses.field(default_factory=list)
    last: types.Decision | None = None
    _high_water: int = 0

    @property
    def high_water(self) -> int:
        """The highest step fed so far."""
        return self._high_water

    @classmethod
    def for_job(cls, job: spec_mod.JobSpec) -> LocalAutoscaler:
        return cls(autoscaler.policy_for_job(job))

    def look(
        self,
        rows: Sequence[records.StepRecord],
        generators: int,
        generator_capacities: Sequence[float | None],
        rescale_cost_s: float | None = None,
    ) -> types.Decision | None:
        """Feed the steps trained since the last look; the change to make now, if any.
        `rescale_cost_s`: what the last change cost (None: none measured yet)."""
        fresh = [r for r in rows if r.step > self._high_water]
        if not fresh:
            return None
        for r in fresh:
            train = r.completion_tokens / r.busy_s if r.busy_s > 0 else None
            s = rates.sample(r.step, generators, generator_capacities, train)
            if s is not None:
                self.samples.append(s)
        self._high_water = fresh[-1].step
        recent = sorted(r.step_s for r in rows[-10:])
        per_step = recent[len(recent) // 2] if recent else None
        obs = types.Observation(self._high_water, generators, tuple(self.samples), per_step, rescale_cost_s)
        self.last = autoscaler.decide(self.policy, self.state, obs)
        self.state = self.last.state
        if not self.last.changed:
            return None
        self.changes.append(self.last)
        return self.last

    def write(self, run_dir: pathlib.Path, elapsed_s: Sequence[float], cost_s: float | None) -> None:
        """`autoscale.json`: each change (with when it was made, seconds since the processes
        started), what the last one cost, and the latest look, whatever it said."""
        changes = [d.to_dict() | {"elapsed_s": t} for d, t in zip(self.changes, elapsed_s, strict=True)]
        last = self.last.to_dict() if self.last else None
        doc = {"changes": changes, "lastChangeCostSeconds": cost_s, "last": last}
        (run_dir / DECISIONS_FILE).write_text(json.dumps(doc, indent=1))

    def summary(self) -> str:
        moves = ", ".join(f"{d.previous} -> {d.generators} at step {d.step}" for d in self.changes)
        return f"autoscaler: {len(self.changes)} change(s) of I{': ' + moves if moves else ''}"
