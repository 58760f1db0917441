"""The local controller's actuator: start worker processes, watch them, restart and stop them cleanly.

Each worker runs in its own session (process group) so that a terminal's Ctrl-C reaches only
`plrl run`, which then stops every group it started, children of children included (vLLM's engine
core, DeepSpeed's helpers). Should `plrl run` itself be killed (SIGKILL, no chance to stop
anything), the kernel sends each worker SIGTERM (the parent-death signal), and a worker ends within
its SIGTERM grace period (`plrl_workers.lifecycle.on_sigterm`), so no process outlives the run.

Neighbours: `local.runner` (decides what to run and, through `policy.decide`, what a death means).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

from plrl_api import names

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """One local 'pod' replica: what to run and with which env."""

    name: str  # e.g. trainer-0, generator-1
    role: names.Role
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: pathlib.Path


@dataclasses.dataclass
class Running:
    spec: ProcessSpec
    proc: subprocess.Popen[bytes]
    started_at: float
    restarts: int = 0
    started_wall: float = dataclasses.field(default_factory=time.time)
    """Wall-clock start (what heartbeat times are compared with)."""

    @property
    def started_utc(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.started_wall, datetime.UTC)

    @property
    def instance(self) -> str:
        """This incarnation of the process (what `policy.decide` counts restarts of)."""
        return f"{self.spec.name}#{self.restarts}"


class Supervisor:
    """Owns the worker processes of one run."""

    def __init__(self, stop_timeout_s: float = 15.0) -> None:
        self._procs: dict[str, Running] = {}
        self._stop_timeout_s = stop_timeout_s

    def start(self, spec: ProcessSpec, restarts: int = 0) -> Running:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = spec.log_path.open("ab")
        env = {**os.environ, **spec.env}
        proc = subprocess.Popen(
            spec.argv,
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_term_when_parent_dies,
        )
        logf.close()
        r = Running(spec=spec, proc=proc, started_at=time.monotonic(), restarts=restarts)
        self._procs[spec.name] = r
        log.debug("started %s (pid %d)", spec.name, proc.pid)
        return r

    def restart(self, name: str) -> Running:
        old = self._procs[name]
        self._kill_group(old.proc, signal.SIGKILL)
        return self.start(old.spec, restarts=old.restarts + 1)

    @property
    def running(self) -> dict[str, Running]:
        return dict(self._procs)

    def exited(self) -> dict[str, int]:
        """Name -> exit code of every process that has ended (and has not been restarted since)."""
        return {n: r.proc.returncode for n, r in self._procs.items() if r.proc.poll() is not None}

    def remove(self, names: list[str]) -> None:
        """Stop these processes for good: they are no longer part of the run."""
        if names:
            self.stop(names)
        for n in names:
            del self._procs[n]

    def wait(self, name: str, timeout: float) -> int | None:
        try:
            return self._procs[name].proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, names: list[str] | None = None) -> None:
        """SIGTERM each process group, then SIGKILL whatever is left after the timeout."""
        targets = [self._procs[n] for n in (names or list(self._procs))]
        for r in targets:
            self._kill_group(r.proc, signal.SIGTERM)
        deadline = time.monotonic() + self._stop_timeout_s
        for r in targets:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(max(0.0, deadline - time.monotonic()))
        for r in targets:
            # The leader may be gone while its children (e.g. vLLM's engine core) are not.
            self._kill_group(r.proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(5)

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


_PR_SET_PDEATHSIG = 1


def _term_when_parent_dies() -> None:
    """Between fork and exec: have the kernel SIGTERM the child when `plrl run` exits (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def python_module(module: str, *args: str) -> tuple[str, ...]:
    """argv that runs `python -m module args` with this interpreter (the run's venv)."""
    return (sys.executable, "-m", module, *args)
