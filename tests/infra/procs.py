"""Process and network plumbing for controlplane.py: free loopback ports, health probes, stopping a
process politely then firmly, and tying children's lives to their parent's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable


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
