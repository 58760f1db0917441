"""`decide(spec, observed, history)`: what a controller should do about a job's workers. Pure.

Both controllers call it, each with its own actuator: the operator's timer (observations from pods
and Leases; actions are API calls) and `plrl run` (observations from processes; actions are
process operations). A decision is plain data:

- `Restart(worker)`: a worker failed and the restart budget allows another try. Where the platform
  restarts it by itself (a kubelet restarting a crashed container) the decision only records it
  (`by_platform`); otherwise the controller replaces it: `plrl run` restarts the process (for a
  trainer: every process of the job, which resumes from the latest checkpoint), the operator
  deletes a hung pod (its heartbeat went stale), one lost with its node (not Ready for
  `heartbeat.timeoutSeconds`) or a generator that stayed slow (`health.stays_slow`) so its
  StatefulSet creates a new one. Every restart
  counts against `spec.failurePolicy.maxRestarts`, once: a replacement decided before a controller
  restart and not yet carried out (the hung pod is still there) comes back as `repeat`, to be carried
  out again without being counted or announced again. A worker that exited
  `names.EXIT_RESTART_ME` (it lost its coordinator, or a newer process took its name) is restarted
  free: the failure that caused it is the one charged.
- `Fail(reason)`: a worker failed with the budget used up; the job ends `Failed`, the reason names
  the worker, how it failed and, where known, its last log lines.
- `Finish(reason)`: trainer rank 0 reported the last step trained and checkpointed.

`trainer_group` names the trainers a trainer's restart takes along (all of them: the group restarts
from its checkpoint as one); both controllers restart them together, counting the one failure.

`History` is what earlier decisions leave behind (restarts used, which platform restarts were
already counted, the outcome). The controller stores the returned history where it survives a
controller restart (the job's status; `plrl run`'s memory for its own lifetime), so a restarted
controller neither repeats nor forgets a decision.

Neighbours: `policy.health` (liveness), `policy.planner` (`current_generators`),
`plrl_operator.handlers` and `plrl_operator.local.runner` (the actuators).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from plrl_api import names, plan
from plrl_api import spec as spec_mod
from plrl_operator.policy import planner


@dataclasses.dataclass(frozen=True)
class Worker:
    """One worker (a pod, or one `plrl run` process) as its controller sees it now."""

    name: str
    role: names.Role
    instance: str
    """Identity of this incarnation (a pod's uid; a local process name and start count)."""
    running: bool
    exit_code: int | None = None
    """Exit code of its last run that ended (None: it never ended)."""
    platform_restarts: int = 0
    """Restarts the platform already did by itself (a container's restartCount; 0 locally)."""
    needs_restart: bool = False
    """It has ended and nothing but this controller will start it again (`plrl run`)."""
    detail: str = ""
    """Why its last run ended, as the platform says (container reason/message, or log lines)."""
    lost_node: str = ""
    """The node it was lost with (not Ready for too long): it needs replacing wherever it stands."""
    how: str = ""
    """How it failed, where its controller judged it ("was lost", "stayed slow"); empty: from
    `running` and `exit_code`."""


@dataclasses.dataclass(frozen=True)
class Observation:
    workers: tuple[Worker, ...] = ()
    finished: bool = False
    """Trainer rank 0 reported the last step trained and checkpointed."""


class Outcome(enum.StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclasses.dataclass(frozen=True)
class History:
    restarts: int = 0
    """Restarts counted so far (against `failurePolicy.maxRestarts`)."""
    counted: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Instance -> platform restarts of it already counted."""
    outcome: Outcome | None = None
    reason: str = ""
    """Why the job reached `outcome`."""
    replacing: frozenset[str] = frozenset()
    """Instances this controller decided to replace (and counted) that were still there then."""


@dataclasses.dataclass(frozen=True)
class Restart:
    worker: str
    role: names.Role
    reason: str
    by_platform: bool
    """The platform already restarted it; the controller only records the restart."""
    repeat: bool = False
    """Decided (and counted) earlier; the replacement is still to be carried out."""
    lost_node: str = ""
    """It is replaced because this node is lost (the operator says so in a NodeNotReady Event)."""


@dataclasses.dataclass(frozen=True)
class Fail:
    reason: str
    worker: str | None = None


@dataclasses.dataclass(frozen=True)
class Finish:
    reason: str


Decision = Restart | Fail | Finish


@dataclasses.dataclass(frozen=True)
class Verdict:
    decisions: tuple[Decision, ...]
    history: History


def _failure(w: Worker) -> str:
    if w.how:
        how = w.how
    elif w.running and w.needs_restart:
        how = "stopped responding"  # alive but silent: its heartbeat went stale
    else:
        how = f"exited with code {w.exit_code}" if w.exit_code is not None else "failed"
    return f"{w.role} {w.name} {how}" + (f": {w.detail}" if w.detail else "")


def decide(spec: spec_mod.JobSpec, observed: Observation, history: History) -> Verdict:
    """The decisions for one look at the job, and the history to remember after them."""
    if history.outcome is not None:
        return Verdict((), history)  # terminal: nothing more to do, ever
    if observed.finished:
        reason = f"trainers finished training.totalSteps={spec.training.total_steps}"
        return Verdict(
            (Finish(reason),), dataclasses.replace(history, outcome=Outcome.SUCCEEDED, reason=reason)
        )
    budget = spec.failure_policy.max_restarts
    restarts = history.restarts
    counted = {w.instance: history.counted.get(w.instance, 0) for w in observed.workers}
    out: list[Decision] = []
    replacing = {w.instance for w in observed.workers if w.instance in history.replacing and w.needs_restart}
    for w in sorted(observed.workers, key=lambda w: (w.role != names.TRAINER, w.name)):
        failures = [True] * max(0, w.platform_restarts - counted[w.instance])
        if w.needs_restart and w.instance in history.replacing:
            out.append(
                Restart(
                    w.name,
                    w.role,
                    f"{_failure(w)}; replacing it",
                    by_platform=False,
                    repeat=True,
                    lost_node=w.lost_node,
                )
            )
        elif w.needs_restart:
            failures.append(False)
        counted[w.instance] = max(counted[w.instance], w.platform_restarts)
        if w.exit_code == names.EXIT_RESTART_ME and failures:
            # It lost its coordinator (or was replaced): a consequence of a failure charged on its
            # own, so it is restarted free. Only its latest exit is known: if several restarts
            # happened unseen, the others are charged.
            free = failures.pop()
            why = f"{w.role} {w.name} lost its coordinator or was replaced; restarted, not counted"
            out.append(Restart(w.name, w.role, why, by_platform=free))
        for by_platform in failures:
            if restarts >= budget:
                reason = f"{_failure(w)}; spec.failurePolicy.maxRestarts={budget} restarts are used up" + (
                    f" ({restarts} so far)" if restarts else ""
                )
                done = History(restarts, counted, Outcome.FAILED, reason)
                return Verdict((*out, Fail(reason, w.name)), done)
            restarts += 1
            if not by_platform:
                replacing.add(w.instance)
            out.append(
                Restart(
                    w.name,
                    w.role,
                    f"{_failure(w)}; restart {restarts}/{budget}",
                    by_platform=by_platform,
                    lost_node="" if by_platform else w.lost_node,
                )
            )
    return Verdict(tuple(out), History(restarts, counted, replacing=frozenset(replacing)))


def trainer_group(decisions: tuple[Decision, ...], workers: tuple[Worker, ...]) -> tuple[str, ...]:
    """The trainers to restart together because of `decisions`: every one, if any trainer is
    restarted. The data-parallel group (and the coordinator in rank 0) cannot go on without the
    failed rank, and a rank restarted on its own could meet its old peers at the rendezvous, so the
    whole group restarts from the latest checkpoint, as torchrun's elastic agent restarts every
    worker. Only the failed rank's restart is counted."""
    failed = any(isinstance(d, Restart) and d.role == names.TRAINER and not d.repeat for d in decisions)
    return tuple(sorted(w.name for w in workers if w.role == names.TRAINER)) if failed else ()


def current_generators(spec: spec_mod.JobSpec, in_effect: int | None) -> int:
    """I to run with: the spec's, else the one in effect (status), else the planner's initial one.
    With autoscaling on, the spec's I is only the initial one: the one in effect wins while it
    still tiles and lies within [minGenerators, maxGenerators].

    Conventional mode has no generator accelerators (every one trains and generates).
    """
    if spec.pipeline.mode is spec_mod.PipelineMode.CONVENTIONAL:
        return 0
    scale = spec.pipeline.autoscale
    if scale.enabled and in_effect is not None:
        top = scale.max_generators if scale.max_generators is not None else spec.resources.total_gpus - 1
        if not scale.min_generators <= in_effect <= top:
            in_effect = None  # the bounds changed under it: start again from the spec
    elif spec.pipeline.generators is not None:
        return spec.pipeline.generators
    if in_effect is not None:
        try:
            plan.PodPlan.of(spec, in_effect)
            return in_effect
        except plan.PlanError:
            pass  # N or GPUs per pod changed so that the old I no longer tiles
    if spec.pipeline.generators is not None:
        return spec.pipeline.generators
    return planner.initial_generators(spec)
