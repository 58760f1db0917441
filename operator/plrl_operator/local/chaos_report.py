"""What a `plrl run --chaos` run cost, per fault kind, from its `chaos.json`. Pure.

`chaos.json` (written by `local.runner`) holds, on one clock (seconds since the processes started):
each injected fault, each restart the policy decided (worker and reason), and each change of the
latest trained step the runner saw. Per fault this module measures

- detection: fault -> the first restart of its target (a kill: the next look at the processes; a
  stop: `heartbeat.timeoutSeconds` of silence). A slow fault is not a failure, so none is expected;
- recovery: fault -> the first step trained after that restart (the job trains again);
- throughput lost: 1 - (steps/s in the `window_s` after the fault) / (steps/s in the `window_s`
  before it), 0 when the job kept its pace.

Neighbours: `local.chaos` (the faults), `local.runner` (writes the file), `bench/chaos_soak.py`
(runs many faults and prints this), `tests/operator/local/test_failover.py`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

WINDOW_S = 20.0


@dataclasses.dataclass(frozen=True)
class FaultCost:
    kind: str
    target: str
    at_s: float
    detection_s: float | None
    """None: no restart of the target followed (expected for `slow`)."""
    recovery_s: float | None
    """None: no step was trained after the restart (the run ended first)."""
    throughput_lost: float | None
    """None: no step was trained in the window before the fault (nothing to compare with)."""
    target_starting: bool = False
    """The target had sent no heartbeat since it (re)started when the fault hit it."""


@dataclasses.dataclass(frozen=True)
class KindCost:
    kind: str
    role: str
    """The targets' role ("generator", "trainer"): a trainer's kill costs a restart of the group."""
    injected: int
    detected: int
    detection_s: tuple[float, ...]
    recovery_s: tuple[float, ...]
    throughput_lost: tuple[float, ...]

    def line(self) -> str:
        return (
            f"{self.kind:<4} {self.role:<9} injected {self.injected}, restarted {self.detected}; medians "
            f"(min-max): detection {span(self.detection_s, '.1f')} s; training again after "
            f"{span(self.recovery_s, '.1f')} s; throughput lost ({WINDOW_S:.0f} s after vs before) "
            f"{span(self.throughput_lost, '.0%')}"
        )


def span(xs: Sequence[float], fmt: str, unit: str = "") -> str:
    """`median (min-max)` of `xs`, each formatted with `fmt` and followed by `unit`; "-" if there
    are none. The form every repeated figure is printed in (here and by `bench/`)."""
    if not xs:
        return "-"
    return f"{statistics.median(xs):{fmt}}{unit} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def _steps_between(progress: Sequence[tuple[float, int]], a: float, b: float) -> float:
    """Steps trained in [a, b): the sum of increases (a resume from an earlier checkpoint counts 0)."""
    total, last = 0, 0
    for t, step in progress:
        if t >= b:
            break
        if t >= a and step > last:
            total += step - last
        last = step
    return float(total)


def fault_costs(doc: dict[str, Any], window_s: float = WINDOW_S) -> list[FaultCost]:
    progress = [(float(t), int(s)) for t, s in doc.get("progress", []) if s is not None]
    restarts = doc.get("restarts", [])
    out = []
    for item in doc.get("injected", []):
        fault, at = item["fault"], float(item["elapsed_s"])
        after = [
            float(r["elapsed_s"]) for r in restarts if r["worker"] == fault["target"] and r["elapsed_s"] >= at
        ]
        detection = after[0] - at if after else None
        recovery = None
        if after:
            trained = [t for t, _ in progress if t > after[0]]
            recovery = trained[0] - at if trained else None
        before = _steps_between(progress, at - window_s, at)
        lost = None if before == 0 else max(0.0, 1.0 - _steps_between(progress, at, at + window_s) / before)
        starting = bool(item.get("target_starting", False))
        out.append(FaultCost(fault["kind"], fault["target"], at, detection, recovery, lost, starting))
    return out


def _role(target: str) -> str:
    return target.rsplit("-", 1)[0]  # generator-1 -> generator


def by_kind(costs: Sequence[FaultCost]) -> list[KindCost]:
    """Costs by fault kind and target role, in that order."""
    out = []
    for kind, role in sorted({(c.kind, _role(c.target)) for c in costs}):
        mine = [c for c in costs if c.kind == kind and _role(c.target) == role]
        out.append(
            KindCost(
                kind=kind,
                role=role,
                injected=len(mine),
                detected=sum(c.detection_s is not None for c in mine),
                detection_s=tuple(c.detection_s for c in mine if c.detection_s is not None),
                recovery_s=tuple(c.recovery_s for c in mine if c.recovery_s is not None),
                throughput_lost=tuple(c.throughput_lost for c in mine if c.throughput_lost is not None),
            )
        )
    return out
