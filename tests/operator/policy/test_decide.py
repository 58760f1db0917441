"""`policy.decide`: the decisions both controllers act on, driven directly.

Cases: a finished report ends the job once (and a terminal history decides nothing more); a dead
generator is restarted and counted; a dead trainer is restarted (its role says so); platform
restarts (a kubelet's restartCount) are counted once, across looks and across a controller restart
that reads the history back; the budget `failurePolicy.maxRestarts` is exact: the (max+1)-th failure
fails the job with a reason naming the worker, its exit code and its detail; `maxRestarts: 0` fails
on the first failure; several failures in one look are counted in order, trainers first; a worker
that exited 0 is not a failure; a hung pod is replaced and counted once across a controller restart
(`repeat`); a worker that only lost its coordinator is restarted free; a trainer's restart takes
every trainer along (`trainer_group`), counted once; `current_generators` keeps an
I that still tiles and falls back to the planner when it does not; conventional mode has no
generators.
"""

from __future__ import annotations

import dataclasses

import pytest

from plrl_api import names, spec
from plrl_operator.policy import decide

MODEL = {"model": {"name": "/models/demo"}}


def _spec(max_restarts: int = 3, **pipeline: object) -> spec.JobSpec:
    return spec.JobSpec.model_validate(
        {
            "model": {"name": "/models/demo"},
            "resources": {"totalGPUs": 4},
            "pipeline": {"generators": 2, **pipeline},
            "failurePolicy": {"maxRestarts": max_restarts},
            "training": {"totalSteps": 100},
        }
    )


def _worker(name: str, role: names.Role = "generator", **kw: object) -> decide.Worker:
    fields: dict[str, object] = {"instance": f"{name}#0", "running": True} | kw
    return decide.Worker(name=name, role=role, **fields)  # type: ignore[arg-type]


def _crashed(name: str, role: names.Role = "generator", code: int = 1, start: int = 0) -> decide.Worker:
    """A `plrl run` process that exited with `code` (only its controller can start it again);
    `start` counts its restarts (each restart is a new instance)."""
    return _worker(
        name,
        role,
        instance=f"{name}#{start}",
        running=False,
        exit_code=code,
        needs_restart=True,
        detail="boom",
    )


def test_a_finished_job_is_finished_once() -> None:
    v = decide.decide(_spec(), decide.Observation(finished=True), decide.History())
    assert v.decisions == (decide.Finish("trainers finished training.totalSteps=100"),)
    assert v.history.outcome is decide.Outcome.SUCCEEDED
    again = decide.decide(_spec(), decide.Observation(workers=(_crashed("g0"),)), v.history)
    assert again.decisions == () and again.history == v.history


def test_a_dead_generator_is_restarted_and_counted() -> None:
    v = decide.decide(_spec(), decide.Observation(workers=(_crashed("g0"),)), decide.History())
    assert len(v.decisions) == 1
    d = v.decisions[0]
    assert isinstance(d, decide.Restart) and (d.worker, d.role, d.by_platform) == ("g0", "generator", False)
    assert d.reason == "generator g0 exited with code 1: boom; restart 1/3"
    assert v.history.restarts == 1 and v.history.outcome is None


def test_a_dead_trainer_is_restarted_as_a_trainer() -> None:
    v = decide.decide(
        _spec(), decide.Observation(workers=(_crashed("t0", "trainer", 137),)), decide.History()
    )
    (d,) = v.decisions
    assert isinstance(d, decide.Restart) and d.role == "trainer" and "exited with code 137" in d.reason


def test_platform_restarts_are_counted_once_even_across_a_controller_restart() -> None:
    pod = _worker("job-train-0", "trainer", instance="uid-1", platform_restarts=2, exit_code=1)
    v = decide.decide(_spec(), decide.Observation(workers=(pod,)), decide.History())
    assert [d.by_platform for d in v.decisions if isinstance(d, decide.Restart)] == [True, True]
    assert v.history.restarts == 2 and v.history.counted == {"uid-1": 2}
    # Same restartCount on the next look, or after the operator restarted and read the history
    # back from status: nothing new to count.
    reread = decide.History(restarts=v.history.restarts, counted=dict(v.history.counted))
    assert decide.decide(_spec(), decide.Observation(workers=(pod,)), reread).decisions == ()
    # A new pod (new uid) starts counting from its own zero.
    fresh = dataclasses.replace(pod, instance="uid-2", platform_restarts=1)
    v2 = decide.decide(_spec(), decide.Observation(workers=(fresh,)), reread)
    assert len(v2.decisions) == 1 and v2.history.restarts == 3


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_the_restart_budget_is_exact(budget: int) -> None:
    history = decide.History()
    for attempt in range(budget):
        v = decide.decide(
            _spec(budget), decide.Observation(workers=(_crashed("g0", start=attempt),)), history
        )
        assert [type(d) for d in v.decisions] == [decide.Restart], attempt
        history = v.history
    last = _crashed("g0", code=3, start=budget)
    v = decide.decide(_spec(budget), decide.Observation(workers=(last,)), history)
    (fail,) = v.decisions
    assert isinstance(fail, decide.Fail) and fail.worker == "g0"
    assert fail.reason.startswith("generator g0 exited with code 3: boom; ")
    assert f"spec.failurePolicy.maxRestarts={budget} restarts are used up" in fail.reason
    assert v.history.outcome is decide.Outcome.FAILED and v.history.reason == fail.reason
    assert decide.decide(_spec(budget), decide.Observation(), v.history).decisions == ()


def test_several_failures_in_one_look_are_counted_in_order() -> None:
    obs = decide.Observation(workers=(_crashed("g1"), _crashed("t0", "trainer"), _crashed("g0")))
    v = decide.decide(_spec(2), obs, decide.History())
    assert [type(d).__name__ for d in v.decisions] == ["Restart", "Restart", "Fail"]
    assert [getattr(d, "worker", None) for d in v.decisions] == ["t0", "g0", "g1"]  # trainers first


def test_a_clean_exit_is_not_a_failure() -> None:
    done = _worker("g0", running=False, exit_code=0)
    assert decide.decide(_spec(0), decide.Observation(workers=(done,)), decide.History()).decisions == ()


def test_generators_in_effect_are_kept_while_they_tile() -> None:
    free = spec.JobSpec.model_validate({**MODEL, "resources": {"totalGPUs": 16, "gpusPerTrainer": 2}})
    assert decide.current_generators(free, 4) == 4
    assert decide.current_generators(free, 5) == 4  # 11 trainer GPUs do not fill 2-GPU pods: planner
    assert decide.current_generators(_spec(), 1) == 2  # the spec's I wins
    conventional = spec.JobSpec.model_validate({**MODEL, "pipeline": {"mode": "conventional"}})
    assert decide.current_generators(conventional, 3) == 0


AUTOSCALE = {"enabled": True, "minGenerators": 1, "maxGenerators": 6}


def test_with_autoscaling_the_spec_s_i_is_only_the_initial_one() -> None:
    scaled = spec.JobSpec.model_validate(
        {**MODEL, "resources": {"totalGPUs": 8}, "pipeline": {"generators": 2, "autoscale": AUTOSCALE}}
    )
    assert decide.current_generators(scaled, None) == 2  # nothing in effect yet: the spec's
    assert decide.current_generators(scaled, 5) == 5  # the autoscaler's, in effect
    assert decide.current_generators(scaled, 7) == 2  # past maxGenerators=6 (bounds lowered): the spec's


def test_a_hung_pod_is_replaced_and_counted_once_across_a_controller_restart() -> None:
    """A running pod whose heartbeat went stale: replaced (not by the platform: the kubelet sees a
    live process). Should the controller restart before the pod is gone, the decision read back from
    the history is carried out again, but not counted or announced again."""
    hung = _worker("gen-0", instance="uid-a", needs_restart=True, detail="no heartbeat for 9 s")
    v = decide.decide(_spec(), decide.Observation(workers=(hung,)), decide.History())
    (d,) = v.decisions
    assert isinstance(d, decide.Restart) and not d.by_platform and not d.repeat
    assert d.reason == "generator gen-0 stopped responding: no heartbeat for 9 s; restart 1/3"
    assert v.history.restarts == 1 and v.history.replacing == {"uid-a"}
    again = decide.decide(_spec(), decide.Observation(workers=(hung,)), v.history)
    (d2,) = again.decisions
    assert isinstance(d2, decide.Restart) and d2.repeat and d2.worker == "gen-0"
    assert again.history.restarts == 1
    # Once it is gone (its replacement has a new uid) nothing is remembered of it.
    fresh = _worker("gen-0", instance="uid-b")
    after = decide.decide(_spec(), decide.Observation(workers=(fresh,)), again.history)
    assert after.decisions == () and after.history.replacing == frozenset()
    assert after.history.restarts == 1


def test_a_worker_that_only_lost_its_coordinator_is_restarted_free() -> None:
    """The trainer died; its generators exit `EXIT_RESTART_ME`. Only the trainer is charged."""
    lost = _crashed("g0", code=names.EXIT_RESTART_ME)
    obs = decide.Observation(workers=(_crashed("t0", "trainer"), lost))
    v = decide.decide(_spec(1), obs, decide.History())
    assert [type(d) for d in v.decisions] == [decide.Restart, decide.Restart]
    assert v.history.restarts == 1
    assert "not counted" in v.decisions[1].reason
    # In a cluster: the kubelet restarted it (restartCount 1, last exit 75): recorded, not charged.
    pod = _worker("g1", instance="uid-g1", exit_code=names.EXIT_RESTART_ME, platform_restarts=1)
    v = decide.decide(_spec(0), decide.Observation(workers=(pod,)), decide.History())
    (d,) = v.decisions
    assert isinstance(d, decide.Restart) and d.by_platform and v.history.restarts == 0
    assert v.history.counted == {"uid-g1": 1}


def test_a_pod_running_again_after_a_crash_is_reported_by_its_exit_code() -> None:
    """The kubelet restarted it, so it runs again: its restart says how its last run ended."""
    pod = _worker("t0", "trainer", instance="uid-t0", exit_code=2, platform_restarts=1, detail="bad model")
    (d,) = decide.decide(_spec(), decide.Observation(workers=(pod,)), decide.History()).decisions
    assert d.reason == "trainer t0 exited with code 2: bad model; restart 1/3"


def test_a_trainer_restart_takes_the_whole_trainer_group_along() -> None:
    """Rank 1 died (the kubelet restarted it): both controllers restart every trainer, so the group
    meets again from its checkpoint; only the failure is counted. A generator's restart, or a
    replacement already decided (`repeat`), takes no trainer along."""
    t0 = _worker("t0", "trainer", instance="uid-t0")
    t1 = _worker("t1", "trainer", instance="uid-t1", exit_code=137, platform_restarts=1)
    g0 = _worker("g0", instance="uid-g0")
    workers = (t0, t1, g0)
    v = decide.decide(_spec(), decide.Observation(workers=workers), decide.History())
    (d,) = v.decisions
    assert (d.worker, v.history.restarts) == ("t1", 1)  # type: ignore[union-attr]
    assert decide.trainer_group(v.decisions, workers) == ("t0", "t1")
    # Seen again: counted already, nothing to restart.
    again = decide.decide(_spec(), decide.Observation(workers=workers), v.history)
    assert again.decisions == () and decide.trainer_group(again.decisions, workers) == ()
    crashed = _worker("g0", instance="uid-g0", exit_code=1, platform_restarts=1)
    v = decide.decide(_spec(), decide.Observation(workers=(t0, crashed)), decide.History())
    assert len(v.decisions) == 1 and decide.trainer_group(v.decisions, (t0, crashed)) == ()
    repeat = (decide.Restart("t1", "trainer", "hung; replacing it", by_platform=False, repeat=True),)
    assert decide.trainer_group(repeat, workers) == ()
