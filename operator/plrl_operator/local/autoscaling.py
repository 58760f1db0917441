"""`plrl run`'s autoscaler: one rate sample per trained step, `policy.autoscaler.decide` on them.

The trainer's capacity comes from each step's record (completion tokens over the step's busy
seconds); the generators' from their heartbeat files (tokens per second spent decoding).

Neighbours: `local.runner` (reads the files, applies the decisions), `policy.autoscale_loop`
(what is kept between looks), `policy.autoscaler` (the rule).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
from collections.abc import Sequence

from plrl_api import records
from plrl_api import spec as spec_mod
from plrl_operator.policy import autoscale_loop, autoscaler, types

DECISIONS_FILE = "autoscale.json"
"""In the run directory: every change the autoscaler made, with its reason."""


@dataclasses.dataclass
class LocalAutoscaler(autoscale_loop.AutoscaleLoop):
    """`AutoscaleLoop` fed from `metrics.jsonl` rows; its clock is seconds since the processes started."""

    made_at_wall: list[str] = dataclasses.field(default_factory=list)
    """When each change was made, as UTC wall time (ISO 8601): to be set beside the workers' logs."""

    @classmethod
    def for_job(cls, job: spec_mod.JobSpec) -> LocalAutoscaler:
        return cls(autoscaler.policy_for_job(job))

    def look_at(
        self,
        rows: Sequence[records.StepRecord],
        generators: int,
        generator_capacities: Sequence[float | None],
        now: float,
    ) -> types.Decision | None:
        """Feed the steps trained since the last look (`now`: the run's clock); the change to
        make now, if any."""
        if rows:
            self.trained_to(rows[-1].step, now)
        for r in rows:
            self.feed(r.step, generators, generator_capacities, r.completion_tokens_per_busy_second)
        recent = sorted(r.step_s for r in rows[-10:])
        return self.look(generators, recent[len(recent) // 2] if recent else None)

    def applied(self, when: float, reached: int) -> None:
        super().applied(when, reached)
        self.made_at_wall.append(datetime.datetime.now(datetime.UTC).isoformat())

    def write(self, run_dir: pathlib.Path) -> None:
        """`autoscale.json`: each change (with when it was made: seconds since the processes
        started, and wall time), what the last one cost, and the latest look, whatever it said."""
        changes = [
            d.to_dict() | {"elapsed_s": t, "at": wall}
            for d, t, wall in zip(self.changes, self.made_at, self.made_at_wall, strict=True)
        ]
        last = self.last.to_dict() if self.last else None
        doc = {
            "changes": changes,
            "lastChangeCostSeconds": self.cost_s,
            "last": last,
            "looks": [d.to_dict() for d in self.looks],
        }
        (run_dir / DECISIONS_FILE).write_text(json.dumps(doc, indent=1))

    def summary(self) -> str:
        moves = ", ".join(f"{d.previous} -> {d.generators} at step {d.step}" for d in self.changes)
        return f"autoscaler: {len(self.changes)} change(s) of I{': ' + moves if moves else ''}"
