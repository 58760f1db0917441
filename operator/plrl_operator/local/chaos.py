"""`plrl run --chaos SPEC`: faults injected into a local run's processes, to see it recover.

A spec is a comma-separated list of faults, `KIND:TARGET@TRIGGER[:ARG]`:

    kill:generator-0@step=20     SIGKILL the target's process group when the job reaches step 20
    stop:trainer-1@step=40:30s   SIGSTOP it at step 40 and SIGCONT it 30 s later (a hang)
    slow:generator-1@t=15s:4x    from 15 s after the chaos started, let it run 1/4 of the time
    random:5[:seed=S]            5 faults of every kind at seeded random steps (seed 0 by default)

Targets are process names as `plrl run` gives them (`trainer-<rank>`, `generator-<k>`); triggers
are `step=N` (the trainer's optimizer step, counted from 1) or `t=DURATION` (`500ms`, `15s`, `2m`).

Three layers, each testable alone: `parse` reads the text (syntax only), `resolve` checks it
against the job (targets, steps) and expands `random:N`; `Schedule` is pure (step and time are
passed in) and says which signals are due; `apply` is the only code that sends one. Each fault
fires once; a slow or a stop ends when its process is restarted (`Schedule.forget`) or the run
ends (`Schedule.end`), so a new process never inherits its predecessor's fault.

Neighbours: `local.runner` (parses `--chaos`, calls `due` from its loop and `forget` on a restart),
`local.processes` (each process is its own process group, which is what the signals go to).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import math
import os
import random
import re
import signal
from collections.abc import Callable, Sequence
from typing import NoReturn, Self

import pydantic

log = logging.getLogger(__name__)

SLOW_PERIOD_S = 0.2
"""One run+stopped cycle of a slowed process: much shorter than the workers' timeouts (seconds),
so they see a slow process rather than a hung one; long enough that the runner's ticks and the
signals cost little."""
SLOW_MAX_FACTOR = 20.0
"""At 20x a slowed process runs 10 ms per period, about what the runner's loop can time on a loaded
machine; more would measure the runner's jitter instead."""
RANDOM_SPAN = (0.1, 0.8)
"""`random:N` puts its faults between 10% and 80% of the run: the start is settled and the end can
still show the recovery."""
RANDOM_GAP_STEPS = 3
"""...at least this many steps apart (or as far apart as a short run allows), so the effects of
one fault do not hide the next one's."""
RANDOM_STOP_S = (5.0, 20.0)
RANDOM_SLOW_X = (2.0, 4.0)
SEED_MAX = 2**32 - 1


class ChaosError(ValueError):
    """A `--chaos` spec that cannot be run; the message names the bad part."""


class Kind(enum.StrEnum):
    KILL = "kill"
    STOP = "stop"
    SLOW = "slow"


class Fault(pydantic.BaseModel):
    """One fault: what is done to which process, and when (exactly one of `step` and `at_s`)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    kind: Kind
    target: str
    step: int | None = pydantic.Field(default=None, ge=1, description="Fire at this training step.")
    at_s: float | None = pydantic.Field(default=None, gt=0, description="...or this long after the start.")
    duration_s: float | None = pydantic.Field(default=None, gt=0, description="stop: seconds until SIGCONT.")
    factor: float | None = pydantic.Field(
        default=None, gt=1, le=SLOW_MAX_FACTOR, description="slow: 4 = runs 1/4 of the time."
    )
    source: str = pydantic.Field(default="", description="The spec item it came from (for messages).")

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.step is None) == (self.at_s is None):
            raise ValueError("a fault needs exactly one trigger, step or at_s")
        if (self.duration_s is not None) != (self.kind is Kind.STOP):
            raise ValueError("duration_s is for stop faults, and stop faults need one")
        if (self.factor is not None) != (self.kind is Kind.SLOW):
            raise ValueError("factor is for slow faults, and slow faults need one")
        return self

    def describe(self, when: str) -> str:
        """`stop trainer-1 at step 40 for 30s`: what is done, `when` (the trigger as it fired)."""
        arg = ""
        if self.duration_s is not None:
            arg = f" for {self.duration_s:g}s"
        if self.factor is not None:
            arg = f" by {self.factor:g}x"
        return f"{self.kind.value} {self.target} at {when}{arg}"


class RandomFaults(pydantic.BaseModel):
    """`random:N[:seed=S]`, expanded by `resolve` once the job's processes and steps are known."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    count: int = pydantic.Field(ge=1)
    seed: int = pydantic.Field(default=0, ge=0, le=SEED_MAX)
    source: str = ""


class ChaosPlan(pydantic.BaseModel):
    """A parsed spec: the faults written out, and at most one random schedule."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    faults: tuple[Fault, ...] = ()
    random: RandomFaults | None = None


class Injected(pydantic.BaseModel):
    """A fault as it was injected: the step and time it fired at (for the run's report)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    fault: Fault
    step: int | None = pydantic.Field(description="The job's step when it fired; None before the first.")
    elapsed_s: float = pydantic.Field(description="Seconds since the chaos started.")
    target_starting: bool = pydantic.Field(
        default=False,
        description="The target had sent no heartbeat since it (re)started, so a stop is judged by "
        "`heartbeat.startupTimeoutSeconds`, not by the heartbeat timeout.",
    )


# ------------------------------------------------------------------ parsing (pure)

_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION = re.compile(rf"({_NUMBER})(ms|s|m)")
_FACTOR = re.compile(rf"({_NUMBER})x")
_INT = re.compile(r"[-+]?\d+")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0}


def _fail(item: str, why: str) -> NoReturn:
    raise ChaosError(f"--chaos: {item!r}: {why}")


def _duration(item: str, what: str, text: str, example: str) -> float:
    m = _DURATION.fullmatch(text)
    if m is None:
        _fail(item, f"{what} {text!r} is not a duration; write e.g. {example} (units ms, s, m)")
    value = float(m[1]) * _UNIT_S[m[2]]
    if value <= 0:
        _fail(item, f"{what} must be positive, got {text!r}")
    return value


def _positive_int(item: str, what: str, text: str) -> int:
    if _INT.fullmatch(text) is None:
        _fail(item, f"{what} {text!r} is not a whole number")
    value = int(text)
    if value < 1:
        _fail(item, f"{what} must be at least 1, got {value}")
    return value


def _parse_random(item: str) -> RandomFaults:
    if "@" in item:
        _fail(item, "random takes no trigger: random:N or random:N:seed=S")
    _, *args = item.split(":")
    if not args or not args[0]:
        _fail(item, "random needs a count, e.g. random:5")
    count = _positive_int(item, "the count", args[0])
    seed = 0
    if len(args) > 1:
        key, sep, value = args[1].partition("=")
        if key != "seed" or not sep:
            _fail(item, f"unexpected {args[1]!r}; random takes random:N or random:N:seed=S")
        if _INT.fullmatch(value) is None or not 0 <= int(value) <= SEED_MAX:
            _fail(item, f"the seed must be a whole number from 0 to {SEED_MAX}, got {value!r}")
        seed = int(value)
    if len(args) > 2:
        _fail(item, f"unexpected {':'.join(args[2:])!r} after the seed")
    return RandomFaults(count=count, seed=seed, source=item)


def _parse_fault(item: str, kind: Kind) -> Fault:
    head, at, tail = item.partition("@")
    target = head.partition(":")[2]  # the kind is the part before the first ':' or '@'
    if not target:
        _fail(item, f"{kind.value} needs a target, e.g. {kind.value}:generator-0@step=20")
    if _NAME.fullmatch(target) is None:
        _fail(item, f"{target!r} is not a process name (e.g. trainer-0, generator-1)")
    if not at or not tail:
        _fail(item, f"{kind.value} needs a trigger, e.g. {head}@step=20 or {head}@t=15s")
    trigger, colon, arg = tail.partition(":")
    key, eq, value = trigger.partition("=")
    step, at_s = None, None
    if key == "step" and eq:
        step = _positive_int(item, "the step", value)
    elif key == "t" and eq:
        at_s = _duration(item, "the time", value, "t=15s")
    else:
        _fail(item, f"unknown trigger {trigger!r} (step=N, or t=15s for seconds since the start)")
    duration_s, factor = None, None
    if kind is Kind.KILL and colon:
        _fail(item, f"kill takes no argument, got {arg!r}")
    if kind is Kind.STOP:
        if not arg:
            _fail(item, "stop needs a duration, e.g. :30s")
        duration_s = _duration(item, "the duration", arg, "30s")
    if kind is Kind.SLOW:
        if not arg:
            _fail(item, "slow needs a factor, e.g. :4x")
        m = _FACTOR.fullmatch(arg)
        if m is None:
            _fail(item, f"the factor {arg!r} is not a factor; write e.g. 4x")
        factor = float(m[1])
        if not 1 < factor <= SLOW_MAX_FACTOR:
            _fail(item, f"the factor must be more than 1x and at most {SLOW_MAX_FACTOR:g}x, got {arg}")
    return Fault(
        kind=kind, target=target, step=step, at_s=at_s, duration_s=duration_s, factor=factor, source=item
    )


def parse(text: str) -> ChaosPlan:
    """The spec's syntax; raises `ChaosError` naming the bad item. Targets and steps are checked
    against the job by `resolve`."""
    if not text.strip():
        raise ChaosError("--chaos: the spec is empty; e.g. kill:generator-0@step=20")
    faults: list[Fault] = []
    rand: RandomFaults | None = None
    for n, raw in enumerate(text.split(","), start=1):
        item = raw.strip()
        if not item:
            raise ChaosError(f"--chaos: item {n} is empty (a doubled or trailing comma?) in {text!r}")
        kind = re.split("[:@]", item, maxsplit=1)[0]
        if kind == "random":
            if rand is not None:
                _fail(item, f"random is given twice (already {rand.source!r})")
            rand = _parse_random(item)
            continue
        if kind not in tuple(Kind):
            _fail(item, f"unknown kind {kind!r} ({', '.join(Kind)})")
        fault = _parse_fault(item, Kind(kind))
        same = [f for f in faults if f.model_dump(exclude={"source"}) == fault.model_dump(exclude={"source"})]
        if same:
            _fail(item, f"this fault is given twice (as {same[0].source!r})")  # e.g. step=5 and step=05
        faults.append(fault)
    return ChaosPlan(faults=tuple(faults), random=rand)


# ------------------------------------------------------------------ resolving against the job (pure)


def resolve(plan: ChaosPlan, process_names: Sequence[str], total_steps: int) -> list[Fault]:
    """The faults to inject into this job: targets must be its processes, steps within its
    `totalSteps`; `random:N` becomes N faults, the same ones for the same seed, job and names."""
    names = list(process_names)
    for f in plan.faults:
        if f.target not in names:
            _fail(f.source, f"unknown target {f.target!r} (this job has {', '.join(names)})")
        if f.step is not None and f.step > total_steps:
            _fail(f.source, f"step {f.step} is beyond the job's {total_steps} training steps")
    out = list(plan.faults)
    if plan.random is not None:
        out += _expand(plan.random, names, total_steps)
    return out


def _expand(spec: RandomFaults, names: Sequence[str], total_steps: int) -> list[Fault]:
    targets = [n for n in names if n.startswith(("trainer-", "generator-"))]
    if not targets:
        _fail(spec.source, f"no trainer or generator to inject faults into (this job has {', '.join(names)})")
    lo = max(1, math.ceil(RANDOM_SPAN[0] * total_steps))
    hi = max(lo, math.floor(RANDOM_SPAN[1] * total_steps))
    n = spec.count
    gap = RANDOM_GAP_STEPS if n == 1 else min(RANDOM_GAP_STEPS, (hi - lo) // (n - 1))
    if gap < 1:
        _fail(
            spec.source,
            f"the job's {total_steps} training steps leave room for at most {hi - lo + 1} faults "
            f"(one per step from {lo} to {hi}, {RANDOM_SPAN[0]:.0%}-{RANDOM_SPAN[1]:.0%} of the run)",
        )
    rng = random.Random(spec.seed)
    # N sorted offsets in the span left once the gaps are set aside, then the gaps added back:
    # uniform over the placements that keep every two faults `gap` steps apart.
    offsets = sorted(rng.randint(0, hi - lo - (n - 1) * gap) for _ in range(n))
    kinds = list(Kind)
    rng.shuffle(kinds)  # cycled, so every kind is in any 3 consecutive faults
    faults = []
    for i, offset in enumerate(offsets):
        kind = kinds[i % len(kinds)]
        faults.append(
            Fault(
                kind=kind,
                target=rng.choice(targets),
                step=lo + offset + i * gap,
                duration_s=round(rng.uniform(*RANDOM_STOP_S), 1) if kind is Kind.STOP else None,
                factor=round(rng.uniform(*RANDOM_SLOW_X), 1) if kind is Kind.SLOW else None,
                source=f"random:{n}:seed={spec.seed}",
            )
        )
    return faults


# ------------------------------------------------------------------ the schedule (pure)


@dataclasses.dataclass(frozen=True)
class Action:
    """A signal due now for a target's process group; `announce` is the line that says a fault
    starts (empty for the SIGCONT ending a stop and for the duty-cycle toggles of a slow)."""

    target: str
    sig: signal.Signals
    announce: str = ""


@dataclasses.dataclass(frozen=True)
class _Slow:
    factor: float
    start_s: float


# Boundaries are computed in floats; a tick landing a hair before one counts as on it, so a runner
# that sleeps until `next_at` gets its toggle at once instead of spinning on the same boundary.
_EPS = 1e-6


class Schedule:
    """Which signals are due, given the job's step and the seconds since the chaos started.

    The runner calls `due` from its loop (at least as often as `next_at` asks, while a slow is on)
    and `apply`s what it returns. A target's process is stopped while any stop on it lasts or a
    slow on it is in the stopped part of its period; the schedule remembers what it stopped, so it
    sends each SIGSTOP/SIGCONT transition once and a stop is not ended early by a slow's toggle.
    """

    def __init__(self, faults: Sequence[Fault], period_s: float = SLOW_PERIOD_S) -> None:
        self._pending = list(faults)
        self._period_s = period_s
        self._stops: dict[str, list[float]] = {}  # target -> when each of its stops ends
        self._slows: dict[str, _Slow] = {}
        self._stopped: set[str] = set()  # targets whose last signal from us was SIGSTOP
        self._ended = False
        self.injected: list[Injected] = []
        """Every fault fired so far, in order, with the step and time it fired at."""

    def due(
        self, step: int | None, elapsed_s: float, starting: Callable[[str], bool] = lambda _: False
    ) -> list[Action]:
        """The actions to apply now. `step` is the job's latest training step (None before the
        first); a step trigger fires once the step reaches it, even if the step jumped past.
        `starting(target)`: whether the target is still starting (recorded with the fault)."""
        if self._ended:
            return []
        actions: list[Action] = []
        for f in [f for f in self._pending if _reached(f, step, elapsed_s)]:
            self._pending.remove(f)
            actions.append(self._fire(f, step, elapsed_s, starting(f.target)))
        for target, ends in list(self._stops.items()):
            self._stops[target] = [e for e in ends if e > elapsed_s + _EPS]
            if not self._stops[target]:
                del self._stops[target]
        for target in sorted(self._stops.keys() | self._slows.keys() | self._stopped):
            want = target in self._stops or self._slow_stopped(target, elapsed_s)
            if want != (target in self._stopped):
                (self._stopped.add if want else self._stopped.discard)(target)
                actions.append(Action(target, signal.SIGSTOP if want else signal.SIGCONT))
        return actions

    def next_at(self, elapsed_s: float) -> float | None:
        """When the next time-driven action is due (a `t=` trigger, the end of a stop, a slow's
        toggle), so the runner can wake for it; None if only step triggers are left."""
        if self._ended:
            return None
        times = [f.at_s for f in self._pending if f.at_s is not None]
        times += [e for ends in self._stops.values() for e in ends]
        for slow in self._slows.values():
            cycle_start, pos = self._phase(slow, elapsed_s)
            stopped_s = self._period_s * (1 - 1 / slow.factor)
            times.append(cycle_start + (stopped_s if pos + _EPS < stopped_s else self._period_s))
        return min(times, default=None)

    def forget(self, target: str) -> list[Action]:
        """End the stops and slows on `target` (the runner restarts it): the new process runs
        freely. The SIGCONT returned, if the schedule had stopped it, lets the old process see a
        SIGTERM; sent to the new one it is harmless."""
        self._stops.pop(target, None)
        self._slows.pop(target, None)
        if target in self._stopped:
            self._stopped.discard(target)
            return [Action(target, signal.SIGCONT)]
        return []

    def end(self) -> list[Action]:
        """The run is ending: no more faults, and a SIGCONT for every process still stopped (so
        the runner's SIGTERM can stop it cleanly)."""
        self._ended = True
        self._pending.clear()
        actions: list[Action] = []
        for target in sorted(self._stops.keys() | self._slows.keys() | self._stopped):
            actions += self.forget(target)
        return actions

    def _fire(self, f: Fault, step: int | None, elapsed_s: float, starting: bool) -> Action:
        self.injected.append(Injected(fault=f, step=step, elapsed_s=elapsed_s, target_starting=starting))
        announce = "chaos: " + f.describe(f"step {step}" if f.step is not None else f"t={elapsed_s:.1f}s")
        if f.kind is Kind.KILL:
            self.forget(f.target)  # nothing to continue: the process it slowed or stopped is gone
            return Action(f.target, signal.SIGKILL, announce)
        if f.kind is Kind.STOP:
            assert f.duration_s is not None  # the model's validator
            self._stops.setdefault(f.target, []).append(elapsed_s + f.duration_s)
        else:
            assert f.factor is not None
            self._slows[f.target] = _Slow(f.factor, elapsed_s)  # a later slow replaces an earlier
        # A slow's period starts with its stopped part, so its first signal is the one announced.
        self._stopped.add(f.target)
        return Action(f.target, signal.SIGSTOP, announce)

    def _phase(self, slow: _Slow, elapsed_s: float) -> tuple[float, float]:
        """The start of the slow's current period, and how far into it `elapsed_s` is."""
        k = math.floor((elapsed_s - slow.start_s + _EPS) / self._period_s)
        cycle_start = slow.start_s + k * self._period_s
        return cycle_start, elapsed_s - cycle_start

    def _slow_stopped(self, target: str, elapsed_s: float) -> bool:
        slow = self._slows.get(target)
        if slow is None:
            return False
        _, pos = self._phase(slow, elapsed_s)
        return pos + _EPS < self._period_s * (1 - 1 / slow.factor)


def _reached(f: Fault, step: int | None, elapsed_s: float) -> bool:
    if f.step is not None:
        return step is not None and step >= f.step
    return f.at_s is not None and elapsed_s + _EPS >= f.at_s


# ------------------------------------------------------------------ the actuator (I/O)


def apply(action: Action, pid_of: Callable[[str], int | None]) -> None:
    """Send `action`'s signal to its target's process group (each `plrl run` process leads its
    own); prints the line of a fault's start. A target that is not running is skipped."""
    pid = pid_of(action.target)
    if action.announce:
        print(action.announce + ("" if pid is not None else f" ({action.target} is not running)"), flush=True)
    if pid is None:
        return
    log.debug("chaos: %s to %s (group %d)", action.sig.name, action.target, pid)
    # Gone already (exited, killed by an earlier fault): nothing to do. PermissionError: the pid
    # was reused by a process that is not ours, which must not be signalled either.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, action.sig)
