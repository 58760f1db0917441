"""Process and network plumbing for the tests: free loopback ports, health probes, stopping a
process politely then firmly, tying children's lives to their parent's (controlplane.py), and
process trees that never outlive a test (`Tree`, `run_tree`: `plrl run` and the benches).

`subprocess.run(timeout=)` kills only the process it started. `plrl run` starts each worker in a
session of its own (so that Ctrl-C reaches only the runner), so after a timeout the workers would
go on running, holding ports, cores and the run directory. A `Tree` marks its command's environment
with a unique variable, which every descendant inherits, and kills by that mark as well as by
parentage: a worker whose parent already died (reparented to init) is still found.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import psutil


def free_port() -> int:
    """A loopback port that was free a moment ago (the component binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run(argv: list[str], log: pathlib.Path) -> None:
    with log.open("ab") as f:
        subprocess.run(argv, check=True, stdout=f, stderr=subprocess.STDOUT, timeout=60)


def http_ok(url: str, ctx: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def terminate(pid: int, gone: Callable[[], bool], grace_s: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not gone():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def exited(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None


def gone(pid: int, work_dir: str) -> bool:
    return not cmdline_mentions(pid, work_dir)


def cmdline_mentions(pid: int, text: str) -> bool:
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    # A zombie has an empty cmdline: already gone for our purposes.
    return text.encode() in cmdline


def die_with_parent() -> None:
    """Runs in the child before exec: ask Linux to SIGKILL it when the parent (pytest) dies. SIGKILL, not
    SIGTERM: all components would get it at once, and an apiserver whose etcd is already gone does not
    finish a graceful shutdown. Linux ties this to the thread that forked, so start a non-detached
    ControlPlane from a long-lived thread."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


# --------------------------------------------------------------------------- process trees

TREE_MARK = "PLRL_TEST_TREE"
"""The environment variable a `Tree` sets to a fresh value; descendants inherit it."""


class Tree:
    """`argv` started in a session of its own, with every process it ever starts killable at once.

    Use as a context manager: leaving the block kills whatever is left of the tree (on success,
    failure, timeout or Ctrl-C alike). `survivors()` names what is still running (e.g. after the
    command exited: processes it should have stopped); `kill()` ends them all.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | pathlib.Path | None = None,
        stdout: int | IO[Any] | None = subprocess.PIPE,
        stderr: int | IO[Any] | None = subprocess.PIPE,
    ) -> None:
        self.mark = uuid.uuid4().hex
        self.proc: subprocess.Popen[str] = subprocess.Popen(
            list(argv),
            env={**(os.environ if env is None else env), TREE_MARK: self.mark},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def members(self) -> list[psutil.Process]:
        """Live (not zombie) processes of the tree: the command, its descendants, anything marked."""
        found: dict[int, psutil.Process] = {}
        if self.proc.poll() is None:  # once reaped, its pid may belong to someone else
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(self.proc.pid)
                for p in [root, *root.children(recursive=True)]:
                    found[p.pid] = p
        for p in psutil.process_iter():
            if p.pid in found or p.pid == os.getpid():
                continue
            with contextlib.suppress(psutil.Error):
                if p.environ().get(TREE_MARK) == self.mark:
                    found[p.pid] = p
        live = []
        for p in found.values():
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    live.append(p)
        return live

    def survivors(self) -> list[str]:
        """Command lines of the tree's live processes other than the command itself."""
        out = []
        for p in self.members():
            if p.pid == self.proc.pid:
                continue
            with contextlib.suppress(psutil.Error):
                out.append(" ".join(p.cmdline()) or p.name())
        return out

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL every process of the tree and every process group they lead, and reap the command.

        Members are stopped first (SIGSTOP) until no new one appears, so none can fork a process
        that escapes between the look and the kill."""
        stopped: dict[int, psutil.Process] = {}
        for _ in range(20):
            new = [p for p in self.members() if p.pid not in stopped]
            if not new:
                break
            for p in new:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGSTOP)
                stopped[p.pid] = p
        groups = set()  # the groups they are in: the command's session, and any they started
        for p in stopped.values():
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(p.pid))
        groups.discard(os.getpgrp())  # never our own
        for pgid in groups:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
        for p in stopped.values():
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(list(stopped.values()), timeout=timeout_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)


class Completed(subprocess.CompletedProcess[str]):
    """`subprocess.run`'s result plus `leftover`: the command lines of processes the command left
    running when it exited (killed since)."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str, leftover: list[str]):
        super().__init__(list(args), returncode, stdout, stderr)
        self.leftover = leftover


def run_tree(
    argv: Sequence[str],
    *,
    timeout: float | None,
    env: Mapping[str, str] | None = None,
    cwd: str | pathlib.Path | None = None,
    check: bool = False,
    stdout: int | IO[Any] | None = subprocess.PIPE,
    stderr: int | IO[Any] | None = subprocess.PIPE,
) -> Completed:
    """`subprocess.run(argv, text=True, timeout=timeout, ...)` for a command that starts processes of
    its own: on timeout (raised as `subprocess.TimeoutExpired`, as there, after the kill), on any
    error, and once the command has exited, the whole tree is killed.

    Captured output goes through files, not pipes: a process left behind that still holds the
    command's stdout would keep a pipe open, and reading it to the end would wait for that process.
    """
    with contextlib.ExitStack() as files:
        captured: dict[str, IO[str]] = {}
        for name, target in (("stdout", stdout), ("stderr", stderr)):
            if target == subprocess.PIPE:
                captured[name] = files.enter_context(tempfile.TemporaryFile("w+"))

        def read(name: str) -> str:
            f = captured.get(name)
            if f is None:
                return ""
            f.seek(0)
            return f.read()

        with Tree(
            argv,
            env=env,
            cwd=cwd,
            stdout=captured.get("stdout", stdout),
            stderr=captured.get("stderr", stderr),
        ) as tree:
            try:
                returncode = tree.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                tree.kill()
                raise subprocess.TimeoutExpired(
                    list(argv), timeout or 0.0, read("stdout"), read("stderr")
                ) from None
            leftover = tree.survivors()
        result = Completed(argv, returncode, read("stdout"), read("stderr"), leftover)
    if check:
        result.check_returncode()
    return result


# --------------------------------------------------------------------------- trainer ranks (benches)


def add_rank_arguments(ap: argparse.ArgumentParser) -> None:
    """The hidden arguments `run_ranks` gives each rank of a bench script that starts itself."""
    ap.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world-size", type=int, default=1, help=argparse.SUPPRESS)


def run_ranks(argv: Sequence[str], ranks: int, *, threads: int = 1, timeout: float = 1800.0) -> list[str]:
    """Run `argv --rank-worker --port P --rank r --world-size N` as `ranks` processes (CPU only,
    `threads` OMP threads each), each in a `Tree`, and return every rank's stdout; exit with the
    failed ranks' stderr tails if one fails. Leaving (done, failed, timed out) kills every rank left."""
    port = free_port()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    with contextlib.ExitStack() as stack:
        trees = []
        for r in range(ranks):
            where = ["--rank-worker", "--port", str(port), "--rank", str(r), "--world-size", str(ranks)]
            trees.append(stack.enter_context(Tree([*argv, *where], env=env)))
        outs = [t.proc.communicate(timeout=timeout) for t in trees]
    failed = [
        f"rank {r}:\n{err[-3000:]}"
        for r, (t, (_, err)) in enumerate(zip(trees, outs, strict=True))
        if t.proc.returncode
    ]
    if failed:
        raise SystemExit(f"{' '.join(argv)} x{ranks} failed:\n" + "\n".join(failed))
    return [out for out, _ in outs]
