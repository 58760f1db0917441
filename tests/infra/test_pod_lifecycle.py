"""The kubelet rules the process runner follows, pure: restarts, back-off, terminations, pod phase,
probe thresholds, log tails, and paths resolved inside a container's root.

Cases: restartPolicy Always / OnFailure / Never; back-off 0, base, 2 base, ... capped; StartError,
Completed and Error terminations, the termination-message file first and FallbackToLogsOnError's log
lines only on failure; phases Pending (init not done, nothing started), Running (one runs, or will
restart), Succeeded, Failed; probes pass after successThreshold and fail after failureThreshold,
attempts spaced by periodSeconds after initialDelaySeconds; `kubectl logs --tail/--limit-bytes` and
`--previous`; an absolute symlink (/var/run -> /run) stays inside the container root.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from tests.infra import pod_lifecycle, pod_logs, pod_probe, pod_shim

Seen = pod_lifecycle.Seen


@pytest.mark.parametrize(
    ("policy", "code", "again"),
    [("Always", 0, True), ("Always", 1, True), ("OnFailure", 0, False), ("OnFailure", 2, True),
     ("Never", 1, False)],
)  # fmt: skip
def test_restart_policy(policy: pod_lifecycle.RestartPolicy, code: int, again: bool) -> None:
    assert pod_lifecycle.restart(policy, code) is again


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [pod_lifecycle.backoff_s(n, 10, 300) for n in range(1, 9)] == [0, 10, 20, 40, 80, 160, 300, 300]


def test_terminations() -> None:
    t = pod_lifecycle.termination(128, 'exec: "x": not found', "", "File", "")
    assert (t.reason, t.message) == ("StartError", 'exec: "x": not found')
    assert pod_lifecycle.termination(0, "", "", "FallbackToLogsOnError", "log").reason == "Completed"
    assert pod_lifecycle.termination(0, "", "", "FallbackToLogsOnError", "log").message == ""
    logs = "\n".join(f"line {i}" for i in range(200))
    t = pod_lifecycle.termination(2, "", "", "FallbackToLogsOnError", logs)
    assert t.reason == "Error" and t.message.endswith("line 199") and len(t.message) <= 2048
    assert pod_lifecycle.termination(2, "", "", "File", logs).message == ""
    assert pod_lifecycle.termination(2, "", "why", "FallbackToLogsOnError", logs).message == "why"


def test_pod_phase() -> None:
    done = Seen("terminated", True, 0, restarting=False)
    running = Seen("running", True)
    waiting = Seen("waiting", False)
    backing_off = Seen("waiting", True, restarting=True)
    failed = Seen("terminated", True, 1, restarting=False)
    assert pod_lifecycle.pod_phase([Seen("running", True)], [waiting], False) == "Pending"
    assert pod_lifecycle.pod_phase([done], [waiting], False) == "Pending"
    assert pod_lifecycle.pod_phase([done], [running, failed], False) == "Running"
    assert pod_lifecycle.pod_phase([], [backing_off], False) == "Running"
    assert pod_lifecycle.pod_phase([], [done, done], False) == "Succeeded"
    assert pod_lifecycle.pod_phase([], [done, failed], False) == "Failed"
    assert pod_lifecycle.pod_phase([failed], [waiting], True) == "Failed"


def test_probe_thresholds_and_schedule() -> None:
    p = pod_probe.Prober({"initialDelaySeconds": 5, "periodSeconds": 2, "successThreshold": 2,
                          "failureThreshold": 2}, started_at=100.0)  # fmt: skip
    assert not p.due(104.9) and p.due(105.0)
    assert not p.record(True, 105.0) and not p.passing
    assert not p.due(106.0) and p.due(107.0)
    assert p.record(True, 107.0) and p.passing
    assert not p.record(False, 109.0) and p.passing and not p.failed
    assert p.record(False, 111.0) and not p.passing and p.failed


def test_log_tails_and_previous_runs(tmp_path: pathlib.Path) -> None:
    assert pod_logs.tail(b"a\nb\nc\n", 2, None) == b"b\nc\n"
    assert pod_logs.tail(b"a\nb\nc\n", None, 3) == b"a\nb"
    assert pod_logs.tail(b"a\nb\n", 0, None) == b""
    (tmp_path / "main").mkdir()
    for n in (0, 1, 10, 2):
        (tmp_path / "main" / f"{n}.log").write_text(str(n))
    assert pod_logs.log_file(tmp_path, "main", previous=False) == tmp_path / "main" / "10.log"
    assert pod_logs.log_file(tmp_path, "main", previous=True) == tmp_path / "main" / "2.log"
    assert pod_logs.log_file(tmp_path, "other", previous=False) is None


def test_paths_resolve_inside_the_container_root(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "var").mkdir()
    os.symlink("/run", root / "var" / "run")  # as on the host: an absolute link
    (root / "etc").mkdir()
    os.symlink("../run/x", root / "etc" / "rel")
    assert pod_shim.resolve_in(str(root), "/var/run/secrets/sa") == str(root / "run" / "secrets" / "sa")
    assert pod_shim.resolve_in(str(root), "/etc/rel/y") == str(root / "run" / "x" / "y")
    assert pod_shim.resolve_in(str(root), "/../../etc") == str(root / "etc")
