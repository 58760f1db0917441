"""End to end: worker pods that die, hang or lose their node mid-run; the job still trains to
Succeeded, or ends Failed once the restart budget is used up.

Killed processes (SIGKILL of the worker in its pod): the kubelet restarts the container and the
operator counts the restart. A killed generator's prompts are re-queued and its restart registers
again; a killed trainer rank 0 (the coordinator) resumes from its latest checkpoint, and the
generator, which lost its coordinator, keeps running and reconnects to it: RESTARTS counts the two
kills and nothing else.

A hung generator: a process stopped with SIGSTOP looks alive to its kubelet (the container is running), so
nothing but the operator's heartbeat check can catch it: within `heartbeat.timeoutSeconds` + one
`intervalSeconds` (+ the operator's status period) the operator deletes the pod, counts the
restart (RESTARTS 1, a WorkerRestarted event saying it stopped responding), the StatefulSet starts
a new generator, which is only given prompts after it registered and loaded the current weights, the
prompts the hung one held are leased again, and the job reaches Succeeded with every prompt trained
once.

A killed trainer rank 1 (of two): the kubelet restarts its container, rank 0 finds the group broken
(exit EXIT_RESTART_ME, not counted), and the operator replaces both trainer pods so the group meets
at a fresh rendezvous and resumes from its latest checkpoint: RESTARTS 1, a TrainerGroupRestarted
event.

A lost node (Ready Unknown and tainted unreachable, as the node lifecycle controller marks a node
whose kubelet stopped posting; the node agent then powers its pods off and reports nothing): its
pods read Running, or Terminating once evicted, forever. After `heartbeat.timeoutSeconds` the
operator force-deletes them (a NodeNotReady event each), the StatefulSets recreate them on the
other node, and the job succeeds with each lost pod counted once.

A slowed generator (of two; the test stops and continues its process, running it a fifth of the
time): trainer rank 0 migrates part of its work to its peer (a SlowGenerator event), and once it has
been slow for `failurePolicy.slowGeneratorReplaceSeconds` the operator replaces its pod (RESTARTS 1,
"stayed slow"); the job succeeds with every prompt trained once.

The operator restarted mid-incident (down while a generator hangs and past the detection bound, up
again, then restarted once more while the replacement starts): the hang is acted on once, counted
once and said once (decisions and restart counts live in the job's status, not the operator's memory).

`failurePolicy.maxRestarts: 0` and a killed generator: the job ends Failed with a condition that
names the worker, how it ended and the budget.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import psutil
import pytest
from kubernetes import client

from plrl_api import names
from tests.infra import nodes, tools
from tests.operator.cluster import e2e, pod_processes, support
from tests.operator.cluster.support import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]
PROMPTS_PER_STEP = 64 // 8
INTERVAL_S, TIMEOUT_S = 1.0, 5.0
STATUS_PERIOD_S = 1.0  # the test operator's --status-interval
# Steps of a job that meets its incident once it has trained 4: enough that it cannot finish first.
# Seen in CI: 30 steps trained in 6 s, and the job was done before its generator was hung.
INCIDENT_STEPS = 150


def _job(tiny: Callable[..., e2e.Tiny], steps: int, **spec: object) -> e2e.Tiny:
    """The tiny job for `steps` steps with a checkpoint every 5 and the tests' quick heartbeat."""
    training = {"totalSteps": steps, "checkpoint": {"everySteps": 5}}
    return tiny(
        training=training, heartbeat={"intervalSeconds": INTERVAL_S, "timeoutSeconds": TIMEOUT_S}, **spec
    )


def _training(tiny: Callable[..., e2e.Tiny], steps: int) -> e2e.Tiny:
    """`_job` applied, once it has trained a few steps."""
    job = _job(tiny, steps)
    job.apply()
    job.watch("Succeeded", timeout_s=240, stop_at_step=4)
    return job


def _mid_run(job: e2e.Tiny) -> None:
    """Fails, saying so, if the job is past half its steps when its incident starts: a test that
    hung or lost a worker of a job about to finish would time out waiting for a replacement that the
    finished job rightly never makes."""
    steps = int(job.doc["spec"]["training"]["totalSteps"])
    rows = job.records()
    done = rows[-1].step if rows else 0
    if done > steps // 2:
        pytest.fail(f"the job had trained {done} of {steps} steps when its incident began: make it longer")


def _succeeds(job: e2e.Tiny, steps: int, restarts: int, timeout_s: float = 400) -> None:
    """The job reaches Succeeded with all its steps done and `restarts` counted."""
    seen = job.watch("Succeeded", timeout_s=timeout_s)
    assert seen[-1].row["STEP"] == str(steps) and seen[-1].row["RESTARTS"] == str(restarts), seen[-1].row


@contextlib.contextmanager
def _hung_generator(job: e2e.Tiny, namespace: str) -> Iterator[tuple[str, Callable[[], bool]]]:
    """SIGSTOP the job's generator (alive to the kubelet, silent to the operator), resumed on the way
    out if it is still there; yields its pod's name and `replaced()`: the pod has a new uid now."""
    (gen,) = [p for p in job.pods() if p["metadata"]["labels"][names.LABEL_ROLE] == names.GENERATOR]
    pod, uid = gen["metadata"]["name"], gen["metadata"]["uid"]
    hung = pod_processes.worker_process(namespace, pod)

    def replaced() -> bool:
        return all(p["metadata"]["uid"] != uid for p in job.pods() if p["metadata"]["name"] == pod)

    hung.suspend()
    try:
        _mid_run(job)  # inside the try: a failed precondition still resumes the process
        yield pod, replaced
    finally:
        with contextlib.suppress(psutil.Error):
            hung.resume()


def test_a_hung_generator_is_replaced_and_the_job_succeeds(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    steps = INCIDENT_STEPS
    job = _training(tiny, steps)
    with _hung_generator(job, namespace) as (pod, replaced):
        stopped_at = time.monotonic()
        eventually(replaced, 60, "the hung generator's pod to be replaced")
        detected_s = time.monotonic() - stopped_at
    bound = TIMEOUT_S + INTERVAL_S + STATUS_PERIOD_S + 2.0  # + a look's rounding and the API's latency
    print(f"hung generator detected and its pod replaced after {detected_s:.1f} s (bound {bound:.0f} s)")
    assert detected_s <= bound

    _succeeds(job, steps, restarts=1)
    messages = job.events("WorkerRestarted")
    assert any(f"generator {pod} stopped responding: no heartbeat for" in m for m in messages), messages
    _accounted(job, steps)


def test_an_operator_restarted_mid_incident_neither_forgets_nor_repeats_the_replacement(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    steps = INCIDENT_STEPS
    job = _training(tiny, steps)
    restarted_from = operator.starts + 1
    operator.stop()  # the operator is down when the generator hangs ...
    with _hung_generator(job, namespace) as (pod, replaced):
        time.sleep(TIMEOUT_S + INTERVAL_S + 2.0)  # ... and stays down past the hang's detection bound
        operator.start()  # it must not forget: the hang is found from the Lease in the API server
        eventually(replaced, 60, "the hung generator's pod to be replaced by the restarted operator")
    # Down again while the replacement starts, before it has renewed its Lease: a successor that
    # judged from memory would find the new pod's Lease stale and charge the same failure again.
    operator.restart()
    _succeeds(job, steps, restarts=1)
    messages = job.events("WorkerRestarted")
    assert len(messages) == 1 and messages[0].startswith(f"generator {pod} stopped responding"), messages
    deletes = [w for w in operator.writes_to(namespace, since_start=restarted_from) if "DELETE" in w]
    assert len(deletes) == 1 and f"/pods/{pod}" in deletes[0], deletes  # one delete, by the first successor
    _accounted(job, steps)


def _pod_name(job: e2e.Tiny, role: str) -> str:
    (pod,) = [p for p in job.pods() if p["metadata"]["labels"][names.LABEL_ROLE] == role]
    return str(pod["metadata"]["name"])


def _accounted(job: e2e.Tiny, steps: int) -> None:
    rows = job.records()
    assert [r.step for r in rows] == list(range(1, steps + 1))
    p = rows[-1].prompts
    assert p.balanced and p.outstanding == 0 and p.trained + p.dropped_by_lag == steps * PROMPTS_PER_STEP, p


def test_a_killed_trainer_rank_restarts_the_whole_trainer_group_and_the_job_succeeds(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    # Killed early in a run long enough to outlast the kill. Seen in CI: 16 steps took 5 s, and the
    # kill meant for step 7 came after the last one (STEP reaches `kubectl get` a few seconds late).
    steps = 40
    job = _job(tiny, steps, resources={"totalGPUs": 3})  # one generator, two trainer pods
    job.apply()
    job.watch("Succeeded", timeout_s=300, stop_at_step=6)  # past the first checkpoint (step 5)
    before = job.uids(names.TRAINER)
    rank1 = next(n for n in before if n.endswith("-1"))
    pod_processes.worker_process(namespace, rank1).kill()
    killed_at = time.monotonic()
    step_killed_at = job.status().get("step", 0)
    assert step_killed_at < steps, f"the job trained all {steps} steps before rank 1 was killed"

    def group_replaced() -> bool:
        now = job.uids(names.TRAINER)
        return len(now) == 2 and not set(now.values()) & set(before.values())

    try:
        # Seen: 0.7 s alone. Once, in CI, past 60 s, leaving nothing to say why: hence the report.
        eventually(group_replaced, 120, "both trainer pods to be replaced")
    except pytest.fail.Exception:
        pytest.fail(_why_not_replaced(job, operator))
    print(
        f"trainer group replaced {time.monotonic() - killed_at:.1f} s after rank 1 was killed "
        f"(at step {step_killed_at} or later)"
    )
    _succeeds(job, steps, restarts=1)
    (group,) = job.events("TrainerGroupRestarted")
    assert f"replacing trainer pods {', '.join(sorted(before))}" in group, group
    restarted = job.events("WorkerRestarted")
    assert any(m.startswith(f"trainer {rank1} exited with code 137") for m in restarted), restarted
    logs = job.log_tails(400)
    assert "resumed from /checkpoints: step" in logs, logs
    # The generator's coordinator (rank 0) went with the group: it reconnected to the new one.
    assert "the coordinator is gone" in logs and "reconnecting" in logs, logs
    _accounted(job, steps)


def _why_not_replaced(job: e2e.Tiny, operator: support.Operator) -> str:
    """What the trainer pods' kubelet said, what the operator decided and logged."""
    pods = []
    for p in job.pods():
        for c in (p.get("status") or {}).get("containerStatuses") or []:
            state = {k: v.get("exitCode", "") for k, v in (c.get("state") or {}).items()}
            last = {k: v.get("exitCode", "") for k, v in (c.get("lastState") or {}).items()}
            name, uid, restarts = p["metadata"]["name"], p["metadata"]["uid"], c.get("restartCount")
            pods.append(f"{name} uid {uid}: restarts {restarts}, state {state}, last {last}")
    events = {r: job.events(r) for r in ("WorkerRestarted", "TrainerGroupRestarted", "ReconcileFailed")}
    return (
        "the trainer group was not replaced within 120 s\n"
        + "\n".join(pods)
        + f"\nevents: {events}\nstatus: {job.status()}\n--- operator ---\n{operator.tail(80)}"
        + f"\n{job.log_tails(30)}"
    )


@pytest.mark.parametrize("tiny_nodes", [2])
def test_pods_on_a_lost_node_are_force_deleted_and_rescheduled_and_the_job_succeeds(
    operator: support.Operator,
    kubectl: tools.Tool,
    namespace: str,
    tiny: Callable[..., e2e.Tiny],
    core_api: client.ApiClient,
) -> None:
    steps = INCIDENT_STEPS
    job = _training(tiny, steps)
    pods = job.pods()
    gen = next(p for p in pods if p["metadata"]["labels"][names.LABEL_ROLE] == names.GENERATOR)
    node = gen["spec"]["nodeName"]
    lost = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods if p["spec"]["nodeName"] == node}
    workers = [pod_processes.worker_process(namespace, name) for name in lost]
    nodes.lose(client.CoreV1Api(core_api), node)
    lost_at = time.monotonic()
    _mid_run(job)
    # The machine is gone: its processes die with it (the node agent powers its pods off).
    eventually(
        lambda: not any(pod_processes.alive(w) for w in workers), 30, f"the processes on {node} to die"
    )
    # Then the eviction its NoExecute taint brings (the taint-eviction controller's delete): with no
    # kubelet to confirm it, the pod stays Terminating until the operator force-deletes it.
    kubectl("delete", "pod", gen["metadata"]["name"], "-n", namespace, "--wait=false")

    def moved() -> bool:
        now = {p["metadata"]["name"]: p for p in job.pods()}
        return all(
            name in now
            and now[name]["metadata"]["uid"] != uid
            and now[name]["spec"].get("nodeName") not in (None, node)
            for name, uid in lost.items()
        )

    eventually(moved, 60, f"the pods on {node} to be rescheduled on the other node")
    moved_s = time.monotonic() - lost_at
    bound = TIMEOUT_S + INTERVAL_S + STATUS_PERIOD_S + 2.0
    print(f"node lost: {sorted(lost)} rescheduled after {moved_s:.1f} s (detection bound {bound:.0f} s)")
    _succeeds(job, steps, restarts=len(lost))
    said = job.events("NodeNotReady")
    for name in lost:
        assert any(f"force-deleting pod {name} on node {node}" in m for m in said), said
    restarted = job.events("WorkerRestarted")
    assert any(f"was lost: its node {node} has not been Ready for" in m for m in restarted), restarted
    _accounted(job, steps)


def test_a_failure_with_the_restart_budget_used_up_fails_the_job_saying_why(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    job = _job(tiny, 40, failurePolicy={"maxRestarts": 0})
    job.apply()
    job.watch("Succeeded", timeout_s=240, stop_at_step=2)
    gen = _pod_name(job, names.GENERATOR)
    pod_processes.worker_process(namespace, gen).kill()
    job.watch("Failed", timeout_s=120)
    failed = next(c for c in job.status()["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True"
    assert failed["message"].startswith(f"generator {gen} exited with code 137"), failed
    assert "spec.failurePolicy.maxRestarts=0 restarts are used up" in failed["message"], failed
    assert any(gen in m for m in job.events("JobFailed"))
    eventually(lambda: not job.pods(), 60, "the failed job's pods to be stopped")


def test_a_generator_that_stays_slow_is_replaced_and_the_job_succeeds(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    steps = 200  # ~2.5 steps/s with two generators: long enough to be judged slow, then replaced
    job = _job(
        tiny,
        steps,
        resources={"totalGPUs": 3},
        pipeline={"generators": 2},
        failurePolicy={"slowGeneratorReplaceSeconds": 20},
    )
    job.apply()
    job.watch("Succeeded", timeout_s=240, stop_at_step=3)
    slow_pod = next(n for n in job.uids(names.GENERATOR) if n.endswith("-1"))
    uid = job.uids(names.GENERATOR)[slow_pod]
    with pod_processes.DutyCycle(pod_processes.worker_process(namespace, slow_pod), factor=5):
        slowed_at = time.monotonic()
        eventually(lambda: job.uids(names.GENERATOR).get(slow_pod, uid) != uid, 150, "the slow pod replaced")
    print(f"slow generator replaced {time.monotonic() - slowed_at:.1f} s after it was slowed")
    _succeeds(job, steps, restarts=1)
    said = job.events("SlowGenerator")
    assert any(m.startswith(f"generator {slow_pod} is slow: ") and "migrated" in m for m in said), said
    restarted = job.events("WorkerRestarted")
    assert any(m.startswith(f"generator {slow_pod} stayed slow: for 2") for m in restarted), restarted
    _accounted(job, steps)
