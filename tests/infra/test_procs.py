"""`procs.run_tree` and `procs.Tree`: a command's whole process tree ends with it, as `plrl run`'s must.

The command here starts what `plrl run` starts: a child in a session of its own (a worker), which
starts a grandchild in yet another session and exits (so the grandchild is reparented to init and no
longer anybody's descendant), then sleeps.

Cases: `subprocess.run(timeout=)` leaves those processes running (why the helper exists); after
`run_tree`'s timeout none of them survives, and the timeout is raised with the output so far; a
command that exits but leaves processes behind has them named in `leftover` and killed; a `Tree`
left by an exception kills its tree; a clean command returns what `subprocess.run` would.
"""

from __future__ import annotations

import contextlib
import pathlib
import subprocess
import sys

import psutil
import pytest

from tests.infra import procs
from tests.polling import eventually

# argv[1]: a marker every process of the tree carries on its command line; argv[2]: "sleep" or "exit".
SPAWNER = """
import subprocess, sys, time
marker, then = sys.argv[1], sys.argv[2]
sleep = [sys.executable, "-c", "import time; time.sleep(600)", marker]
# A worker that starts another in a session of its own and exits: that one is orphaned.
orphaner = "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True)"
subprocess.Popen([sys.executable, "-c", orphaner, *sleep], start_new_session=True).wait()
subprocess.Popen(sleep, start_new_session=True)
print("started", flush=True)
if then == "sleep":
    time.sleep(600)
"""


def alive(marker: str) -> list[int]:
    """Pids of live (not zombie) processes with `marker` on their command line."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and marker in (p.info["cmdline"] or []):
            found.append(p.pid)
    return found


def spawner(marker: str, then: str) -> list[str]:
    return [sys.executable, "-c", SPAWNER, marker, then]


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()


def test_subprocess_run_with_a_timeout_leaves_the_workers_running(tmp_path: pathlib.Path) -> None:
    marker = str(tmp_path / "plain")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run(spawner(marker, "sleep"), stdout=subprocess.DEVNULL, timeout=5)
        assert len(alive(marker)) == 2  # the child and the grandchild: this is the bug
    finally:
        kill(alive(marker))


def test_after_a_timeout_no_process_of_the_tree_survives(tmp_path: pathlib.Path) -> None:
    marker = str(tmp_path / "tree")
    try:
        with pytest.raises(subprocess.TimeoutExpired) as timed_out:
            procs.run_tree(spawner(marker, "sleep"), timeout=5)
        assert alive(marker) == []
        printed: object = timed_out.value.stdout  # typed bytes; text here, as with subprocess.run(text=True)
        assert printed == "started\n"  # what it printed before the timeout
    finally:
        kill(alive(marker))


def test_processes_left_behind_by_a_command_that_exited_are_named_and_killed(tmp_path: pathlib.Path) -> None:
    marker = str(tmp_path / "leak")
    try:
        r = procs.run_tree(spawner(marker, "exit"), timeout=60)
        assert (r.returncode, r.stdout) == (0, "started\n")
        assert len(r.leftover) == 2 and all(marker in cmd for cmd in r.leftover)
        assert alive(marker) == []
    finally:
        kill(alive(marker))


def test_a_tree_left_by_an_exception_is_killed(tmp_path: pathlib.Path) -> None:
    marker = str(tmp_path / "raised")
    try:
        with (
            pytest.raises(RuntimeError, match="the test failed"),
            procs.Tree(spawner(marker, "sleep")) as tree,
        ):
            assert tree.proc.stdout is not None
            assert tree.proc.stdout.readline() == "started\n"
            eventually(lambda: len(tree.survivors()) == 2, what="both workers to start")
            raise RuntimeError("the test failed")
        assert alive(marker) == [] and tree.proc.returncode is not None
    finally:
        kill(alive(marker))


def test_a_clean_command_returns_what_subprocess_run_would() -> None:
    argv = [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"]
    r = procs.run_tree(argv, timeout=60)
    want = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert (r.args, r.returncode, r.stdout, r.stderr) == (want.args, 3, "out\n", "err\n")
    assert r.leftover == []
    with pytest.raises(subprocess.CalledProcessError):
        procs.run_tree(argv, timeout=60, check=True)
