"""How a worker ends: when its work is done (at once under `plrl run`, on SIGTERM in a pod), and
within a bounded time of SIGTERM whatever it is doing.

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
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from plrl_api import names
from plrl_workers import heartbeat

log = logging.getLogger("plrl.lifecycle")


def park(beat: heartbeat.Heartbeat | None, stop: threading.Event, what: str) -> None:
    """In a pod (`beat` renews its Lease on the API server): wait for `stop` (SIGTERM). Otherwise
    return."""
    if beat is None or not beat.in_cluster or stop.is_set():
        return
    log.info("%s; waiting for the operator to stop this pod", what)
    stop.wait()


# A worker told to stop gets this long to wind down (drain rollouts, leave the weight group) before
# it kills itself: one blocked on a dead peer (a collective, a coordinator that is gone) must not
# outlive its controller. Below the pods' terminationGracePeriodSeconds, so it fires first there too.
TERM_GRACE_S = 20.0


def on_sigterm(stop: Callable[[], None], grace_s: float = TERM_GRACE_S) -> None:
    """On SIGTERM call `stop` (from the main thread, as signal handlers run), and if the process is
    still alive `grace_s` later, end it and its children hard."""

    def handler(signum: int, _frame: object) -> None:
        stop()
        timer = threading.Timer(grace_s, _die, args=(grace_s,))
        timer.daemon = True
        timer.start()
        signal.signal(signal.SIGTERM, lambda *_: None)  # a second SIGTERM changes nothing

    signal.signal(signal.SIGTERM, handler)


def exit_now(code: int) -> NoReturn:
    """Exit with `code` without the interpreter's teardown (its destructors may hang or abort),
    after flushing the logs and stdio."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _die(grace_s: float) -> None:
    log.error("still running %.0f s after SIGTERM; exiting hard", grace_s)
    if os.getpgrp() == os.getpid():  # leader of its own group (plrl run): take the children along
        logging.shutdown()
        os.killpg(os.getpgrp(), signal.SIGKILL)
    exit_now(names.EXIT_RESTART_ME)  # ended hard, not failed: restarted, not charged
