"""The worker processes of pods that really run (the node agent's process runner), for tests that
kill, stop or slow one: `worker_process` finds it by the identity its pod gives it, `DutyCycle`
slows it.
"""

from __future__ import annotations

import contextlib
import threading

import psutil

from plrl_api import names


def alive(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def worker_process(namespace: str, pod: str) -> psutil.Process:
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


class DutyCycle:
    """Keeps a process running `1/factor` of the time (SIGSTOP/SIGCONT every `period_s`): slow, but
    never silent for long enough to look hung."""

    def __init__(self, proc: psutil.Process, factor: float, period_s: float = 0.25) -> None:
        self._proc, self._run_s, self._period_s = proc, period_s / factor, period_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> DutyCycle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        with contextlib.suppress(psutil.Error):
            self._proc.resume()

    def _loop(self) -> None:
        while not self._done.is_set():
            try:
                self._proc.suspend()
                self._done.wait(self._period_s - self._run_s)
                self._proc.resume()
            except psutil.Error:
                return  # it is gone: replaced
            self._done.wait(self._run_s)
