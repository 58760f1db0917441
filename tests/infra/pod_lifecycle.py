"""The kubelet's rules for containers that exit, as pure functions: whether to restart, after what
back-off, what the termination says, and which phase the pod is in.

- `restart(policy, exit_code)`: Always restarts everything, OnFailure only non-zero exits, Never none.
- `backoff_s(n, base, cap)`: the delay before the restart that follows the n-th consecutive failure:
  the first restart is immediate, then base, 2 base, 4 base ... up to cap (a kubelet: 10 s up to
  5 min); a run that lasted `reset_after_s` (2 x cap) starts the count again.
- `termination(...)`: reason (Completed, Error, StartError) and message (the container's
  terminationMessagePath file; with FallbackToLogsOnError and a failure, the log's last lines).
- `pod_phase(...)`: Pending until every init container has succeeded and a container has started;
  Running while any container runs or will be restarted; Succeeded / Failed once every container has
  terminated for good (restartPolicy Never / OnFailure).

Neighbours: pod_runner.py (applies them), node_agent.pod_status (writes what they decide).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

RestartPolicy = Literal["Always", "OnFailure", "Never"]
EXIT_START_ERROR = 128
MESSAGE_MAX_BYTES = 4096
FALLBACK_LINES, FALLBACK_BYTES = 80, 2048


def restart(policy: RestartPolicy, exit_code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def backoff_s(failures: int, base_s: float, cap_s: float) -> float:
    """Delay before the next start after `failures` consecutive exits (1: the first exit)."""
    if failures <= 1:
        return 0.0
    return float(min(cap_s, base_s * 2 ** (failures - 2)))


@dataclasses.dataclass(frozen=True)
class Termination:
    exit_code: int
    reason: str
    message: str


def termination(
    exit_code: int,
    start_error: str,
    message_file: str,
    policy: str,
    log_tail: str,
) -> Termination:
    if exit_code == EXIT_START_ERROR and start_error:
        return Termination(exit_code, "StartError", start_error)
    reason = "Completed" if exit_code == 0 else "Error"
    message = message_file.encode()[:MESSAGE_MAX_BYTES].decode(errors="ignore")
    if not message.strip() and exit_code != 0 and policy == "FallbackToLogsOnError":
        lines = "\n".join(log_tail.splitlines()[-FALLBACK_LINES:])
        message = lines.encode()[-FALLBACK_BYTES:].decode(errors="ignore")
    return Termination(exit_code, reason, message)


ContainerPhase = Literal["waiting", "running", "terminated"]


@dataclasses.dataclass(frozen=True)
class Seen:
    """One container as the phase rule needs it."""

    state: ContainerPhase
    ever_started: bool
    exit_code: int | None = None
    restarting: bool = False
    """Terminated (or backing off) but the policy will start it again."""


def pod_phase(init: Sequence[Seen], containers: Sequence[Seen], init_failed: bool) -> str:
    if init_failed:
        return "Failed"
    if any(s.state != "terminated" or s.exit_code != 0 for s in init):
        return "Pending"
    if any(s.state == "running" for s in containers):
        return "Running"
    if not any(s.ever_started for s in containers):
        return "Pending"
    if any(s.restarting or s.state == "waiting" for s in containers):
        return "Running"
    return "Succeeded" if all(s.exit_code == 0 for s in containers) else "Failed"
