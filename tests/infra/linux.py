"""The few Linux system calls the pod runtime needs and Python 3.11 lacks (unshare, setns, mount,
sethostname, prctl), through libc, each raising OSError with errno like the os module does.

Neighbours: pod_shim.py (the only caller that changes namespaces), pod_net.py (opens a socket inside
a pod's network namespace).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

MNT_DETACH = 0x2

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

NAMESPACES = {"net": CLONE_NEWNET, "uts": CLONE_NEWUTS, "ipc": CLONE_NEWIPC, "mnt": CLONE_NEWNS}
"""The /proc/<pid>/ns/<name> files a container joins (its pod's sandbox) and their setns types."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def setns(path: str, nstype: int) -> None:
    """Join the namespace that `path` (e.g. /proc/<pid>/ns/net) refers to (this thread only for net)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), f"setns {path}")
    finally:
        os.close(fd)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def b(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    _check(
        _libc.mount(b(source), b(target), b(fstype), ctypes.c_ulong(flags), b(data)),
        f"mount {source} -> {target} ({fstype or 'bind'})",
    )


def umount(target: str, flags: int = MNT_DETACH) -> None:
    _check(_libc.umount2(os.fsencode(target), ctypes.c_int(flags)), f"umount {target}")


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, ctypes.c_size_t(len(raw))), "sethostname")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), 0, 0, 0), "prctl")
