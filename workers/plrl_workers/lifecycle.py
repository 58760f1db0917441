"""How a worker whose work is done ends: at once under `plrl run`, on SIGTERM in a pod.

Worker pods belong to StatefulSets, whose pods always have `restartPolicy: Always`: a worker that
exited 0 after the last step would be started again by its kubelet (and every such restart would
count against `failurePolicy.maxRestarts`). So a worker that renews a Lease (it runs in a pod) and has
finished its work waits instead, still renewing its Lease, until the operator, which marks the job
Succeeded once trainer rank 0's Lease says `finished`, scales both StatefulSets to zero and the
kubelet sends SIGTERM. Under `plrl run` nothing renews a Lease and the process exits as before (the
local runner reads trainer rank 0's exit code 0 as the end of the job).

Neighbours: `generator.py` and `trainer.py` (the callers), `heartbeat.py` (the Lease that keeps being
renewed meanwhile), the operator's `policy.decide` (Finish) and `render` (replicas 0 once finished).
"""

from __future__ import annotations

import logging
import threading

from plrl_workers import heartbeat

log = logging.getLogger("plrl.lifecycle")


def park(beat: heartbeat.Heartbeat | None, stop: threading.Event, what: str) -> None:
    """In a pod (`beat` is its running Lease renewal): wait for `stop` (SIGTERM). Otherwise return."""
    if beat is None or stop.is_set():
        return
    log.info("%s; waiting for the operator to stop this pod", what)
    stop.wait()
