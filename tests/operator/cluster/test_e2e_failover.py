"""End to end: worker pods that die or hang mid-run; the job still trains to Succeeded.

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
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable

import psutil
import pytest

from plrl_api import names
from tests.infra import tools
from tests.operator.cluster import e2e, support
from tests.operator.cluster.support import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]
PROMPTS_PER_STEP = 64 // 8
INTERVAL_S, TIMEOUT_S = 1.0, 5.0
STATUS_PERIOD_S = 1.0  # the test operator's --status-interval


def _worker_process(namespace: str, pod: str) -> psutil.Process:
    """The pod's worker process, found by the identity the pod gives it (downward API env)."""
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            argv = " ".join(p.info["cmdline"] or [])
            if "plrl-worker" not in argv and "plrl_workers" not in argv:
                continue
            env = p.environ()
            if env.get(names.ENV_POD_NAME) == pod and env.get(names.ENV_NAMESPACE) == namespace:
                return p
    raise LookupError(f"no worker process for pod {namespace}/{pod}")


def test_a_hung_generator_is_replaced_and_the_job_succeeds(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    steps = 30
    job = tiny(
        training={"totalSteps": steps, "checkpoint": {"everySteps": 5}},
        heartbeat={"intervalSeconds": INTERVAL_S, "timeoutSeconds": TIMEOUT_S},
    )
    job.apply()
    job.watch("Succeeded", timeout_s=240, stop_at_step=4)
    (gen,) = [p for p in job.pods() if p["metadata"]["labels"][names.LABEL_ROLE] == names.GENERATOR]
    pod, uid = gen["metadata"]["name"], gen["metadata"]["uid"]
    hung = _worker_process(namespace, pod)
    hung.suspend()  # SIGSTOP: alive to the kubelet, silent to the operator
    stopped_at = time.monotonic()
    try:

        def replaced() -> bool:
            return all(p["metadata"]["uid"] != uid for p in job.pods() if p["metadata"]["name"] == pod)

        eventually(replaced, 60, "the hung generator's pod to be replaced")
        detected_s = time.monotonic() - stopped_at
    finally:
        with contextlib.suppress(psutil.Error):
            hung.resume()
    bound = TIMEOUT_S + INTERVAL_S + STATUS_PERIOD_S + 2.0  # + a look's rounding and the API's latency
    print(f"hung generator detected and its pod replaced after {detected_s:.1f} s (bound {bound:.0f} s)")
    assert detected_s <= bound

    seen = job.watch("Succeeded", timeout_s=300)
    assert seen[-1].row["STEP"] == str(steps) and seen[-1].row["RESTARTS"] == "1", seen[-1].row
    events = json.loads(
        kubectl(
            "get", "events", "-n", namespace, "--field-selector", "reason=WorkerRestarted", "-o", "json"
        ).stdout
    )["items"]
    messages = [e["message"] for e in events]
    assert any(f"generator {pod} stopped responding: no heartbeat for" in m for m in messages), messages
    rows = job.records()
    assert [r.step for r in rows] == list(range(1, steps + 1))
    p = rows[-1].prompts
    assert p.balanced and p.outstanding == 0 and p.trained + p.dropped_by_lag == steps * PROMPTS_PER_STEP, p


def _pod_name(job: e2e.Tiny, role: str) -> str:
    (pod,) = [p for p in job.pods() if p["metadata"]["labels"][names.LABEL_ROLE] == role]
    return str(pod["metadata"]["name"])


def test_killed_generator_and_trainer_processes_are_restarted_and_the_job_succeeds(
    operator: support.Operator, kubectl: tools.Tool, namespace: str, tiny: Callable[..., e2e.Tiny]
) -> None:
    steps = 40
    job = tiny(
        training={"totalSteps": steps, "checkpoint": {"everySteps": 5}},
        heartbeat={"intervalSeconds": INTERVAL_S, "timeoutSeconds": TIMEOUT_S},
    )
    job.apply()
    job.watch("Succeeded", timeout_s=240, stop_at_step=4)
    _worker_process(namespace, _pod_name(job, names.GENERATOR)).kill()
    job.watch("Succeeded", timeout_s=240, stop_at_step=12)
    _worker_process(namespace, _pod_name(job, names.TRAINER)).kill()

    seen = job.watch("Succeeded", timeout_s=400)
    assert seen[-1].row["STEP"] == str(steps) and seen[-1].row["RESTARTS"] == "2", seen[-1].row
    logs = job.log_tails(400)
    assert "resumed from /checkpoints: step" in logs, logs
    assert "the coordinator is gone" in logs and "reconnecting" in logs, logs
    rows = job.records()
    assert [r.step for r in rows] == list(range(1, steps + 1))
    p = rows[-1].prompts
    assert p.balanced and p.outstanding == 0 and p.trained + p.dropped_by_lag == steps * PROMPTS_PER_STEP, p
