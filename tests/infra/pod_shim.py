"""The pod runtime's process side: what containerd's shim and runc do, for the fake nodes' pods.

    python -m tests.infra.pod_shim sandbox PLAN.json     the pod sandbox ("pause"): holds the pod's
                                                         network, UTS, IPC and mount namespaces
    python -m tests.infra.pod_shim container PLAN.json   one run of one container, inside them

The sandbox unshares its namespaces, sets the pod's hostname, mounts the pod's memory-backed emptyDirs
(tmpfs, so every container of the pod sees the same files), prints its pid and then waits until its
stdin closes. Nothing in it outlives the sandbox: when it exits the kernel frees the namespaces (the
pod's veth and tmpfs go with them).

A container run joins the sandbox's namespaces, then unshares a mount and a PID namespace and forks
the container's init (PID 1, as in a real container). That child builds the container's root: an
overlay over the host's `/` whose writable layer is a private tmpfs (so mount points such as
/etc/plrl never touch the host), the host's other filesystems bound in, a fresh /proc, a minimal
/dev (null, zero, full, random, urandom, tty, pts, shm) and the pod's volumes bound at their
mountPaths (deepest last); it chroots there and execs the command with exactly the container's
environment. The parent stays as the shim: it forwards signals to the child and exits with the
child's status (128 + signal when killed, as a kubelet reports it). Both set PR_SET_PDEATHSIG, so
killing the node agent kills the shim, the shim's death kills PID 1, and PID 1's death makes the kernel
kill everything else in the container: no orphan survives.

An exec that fails (no such command) writes the reason to the plan's `start_error_file` and exits 128,
which the runner reports as `StartError`, like containerd.

Stdlib only (it starts for every container run). Neighbours: linux.py (the system calls), pod_runner.py
(writes the plans, reads the exit codes), pod_fs.py (what the mounts are), pod_net.py (the sandbox's
network, configured from outside once it runs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
from typing import Any

from tests.infra import linux

EXIT_START_ERROR = 128
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


@dataclasses.dataclass(frozen=True)
class Mount:
    source: str
    """Host path: a directory, or a file (bound over a file, e.g. /etc/hosts)."""
    target: str
    """Path inside the container."""
    read_only: bool = False


@dataclasses.dataclass(frozen=True)
class SandboxPlan:
    hostname: str
    parent_pid: int
    tmpfs: tuple[str, ...] = ()
    """Host directories to mount a tmpfs on, in the sandbox's mount namespace (emptyDir medium Memory)."""


@dataclasses.dataclass(frozen=True)
class ContainerPlan:
    sandbox_pid: int
    parent_pid: int
    root_dir: str
    """An empty host directory: the container's writable layer and root are mounted on it (privately)."""
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str = "/"
    mounts: tuple[Mount, ...] = ()
    exclude: tuple[str, ...] = ()
    """Host mount points under these prefixes are not carried into the container (the agent's state)."""
    no_new_privs: bool = False
    start_error_file: str = ""
    shm_size: str = "64m"


def dump(plan: SandboxPlan | ContainerPlan, path: pathlib.Path) -> pathlib.Path:
    path.write_text(json.dumps(dataclasses.asdict(plan)))
    return path


def _load_container(doc: dict[str, Any]) -> ContainerPlan:
    mounts = tuple(Mount(**m) for m in doc.pop("mounts"))
    return ContainerPlan(mounts=mounts, argv=tuple(doc.pop("argv")), exclude=tuple(doc.pop("exclude")), **doc)


def _die_with(parent_pid: int) -> None:
    """SIGKILL when the parent dies; if it already has, go now (the race before prctl)."""
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(137)


def _die_with_shim(alive: int) -> None:
    """In PID 1 of a new PID namespace getppid() is 0, so the race before prctl is closed by a pipe:
    `alive` reads EOF only once the shim (holding the write end) is gone."""
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    os.set_blocking(alive, False)
    try:
        gone = os.read(alive, 1) == b""
    except BlockingIOError:
        gone = False
    if gone:
        os._exit(137)
    os.close(alive)


# --------------------------------------------------------------------------- sandbox


def sandbox(plan: SandboxPlan) -> int:
    _die_with(plan.parent_pid)
    linux.unshare(linux.CLONE_NEWNET | linux.CLONE_NEWUTS | linux.CLONE_NEWIPC | linux.CLONE_NEWNS)
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    linux.sethostname(plan.hostname)
    for d in plan.tmpfs:
        linux.mount("tmpfs", d, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "mode=1777")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(os.getpid(), flush=True)
    sys.stdin.buffer.read()  # until the agent closes our stdin (or dies)
    return 0


# --------------------------------------------------------------------------- container


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, fstype) of every mount in this mount namespace, in mount order."""
    out = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        point = left.split()[4].encode().decode("unicode_escape")
        out.append((point, right.split()[0]))
    return out


def _top_mounts(exclude: tuple[str, ...]) -> list[str]:
    """Host mount points directly under `/`: their own submounts come along with a recursive bind."""
    points = {p for p, _ in _mount_points() if p != "/"}

    def under(point: str, other: str) -> bool:
        return point.startswith(other.rstrip("/") + "/")

    return sorted(
        p
        for p in points
        if p not in ("/proc", "/dev")
        and not any(p == e or under(p, e) for e in exclude)
        and not any(under(p, q) for q in points)
    )


def resolve_in(root: str, path: str) -> str:
    """`path` inside the directory tree `root`, following symlinks as if `root` were `/` (an absolute
    link such as /var/run -> /run must not lead out of the container's root onto the host's)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = os.path.join(root, *done, part)
        if os.path.islink(here):
            hops += 1
            if hops > 40:
                raise OSError(f"too many levels of symbolic links resolving {path} in {root}")
            link = os.readlink(here)
            if link.startswith("/"):
                done = []
            parts = [p for p in link.split("/") if p not in ("", ".")] + parts
            continue
        done.append(part)
    return os.path.join(root, *done)


def _bind(source: str, target: str, read_only: bool) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            pathlib.Path(target).touch()
    linux.mount(source, target, None, linux.MS_BIND | linux.MS_REC)
    if read_only:
        linux.mount(None, target, None, linux.MS_BIND | linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_REC)


def _dev(root: str, shm_size: str) -> None:
    dev = f"{root}/dev"
    linux.mount("tmpfs", dev, "tmpfs", linux.MS_NOSUID, "mode=755,size=65536k")
    for name in DEVICES:
        _bind(f"/dev/{name}", f"{dev}/{name}", False)
    os.makedirs(f"{dev}/pts")
    linux.mount(
        "devpts",
        f"{dev}/pts",
        "devpts",
        linux.MS_NOSUID | linux.MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=620",
    )
    os.symlink("pts/ptmx", f"{dev}/ptmx")
    os.makedirs(f"{dev}/shm")
    linux.mount("shm", f"{dev}/shm", "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, f"mode=1777,size={shm_size}")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{dev}/{name}")
    os.symlink("/proc/self/fd", f"{dev}/fd")


def _build_root(plan: ContainerPlan) -> str:
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    base = plan.root_dir
    linux.mount("tmpfs", base, "tmpfs", 0, "mode=755")
    for d in ("upper", "work", "merged"):
        os.makedirs(f"{base}/{d}")
    root = f"{base}/merged"
    tops = _top_mounts((*plan.exclude, base))
    linux.mount("overlay", root, "overlay", 0, f"lowerdir=/,upperdir={base}/upper,workdir={base}/work")
    for point in tops:
        _bind(point, resolve_in(root, point), False)
    # Namespace files bound on the host (ip netns) must not be pinned by a container's copy.
    for point, fstype in reversed(_mount_points()):
        if fstype == "nsfs" and point.startswith(root + "/"):
            linux.umount(point)
    linux.mount("proc", f"{root}/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
    _dev(root, plan.shm_size)
    for m in sorted(plan.mounts, key=lambda m: m.target.rstrip("/").count("/")):
        _bind(m.source, resolve_in(root, m.target), m.read_only)
    return root


def _exec(plan: ContainerPlan) -> None:
    """The container's PID 1: build the root, chroot, exec. Returns only by raising."""
    root = _build_root(plan)
    os.chroot(root)
    os.chdir(plan.cwd or "/")
    if plan.no_new_privs:
        linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    exe = plan.argv[0]
    found = exe if "/" in exe else shutil.which(exe, path=plan.env.get("PATH", ""))
    if not found or not os.access(found, os.X_OK):
        raise FileNotFoundError(f'exec: "{exe}": executable file not found in $PATH')
    os.execve(found, list(plan.argv), plan.env)


def container(plan: ContainerPlan) -> int:
    _die_with(plan.parent_pid)
    for name, nstype in linux.NAMESPACES.items():
        linux.setns(f"/proc/{plan.sandbox_pid}/ns/{name}", nstype)
    linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWPID)
    error = os.open(plan.start_error_file or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC)
    alive_r, alive_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(alive_w)
            _die_with_shim(alive_r)
            _exec(plan)
        except BaseException as err:  # whatever stopped the exec is the start error
            message = str(err) if isinstance(err, FileNotFoundError) else f"{type(err).__name__}: {err}"
            os.write(error, message.encode())
            os.write(2, f"{message}\n".encode())
        os._exit(EXIT_START_ERROR)
    os.close(error)
    os.close(alive_r)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("sandbox", "container"):
        print("usage: python -m tests.infra.pod_shim sandbox|container PLAN.json", file=sys.stderr)
        return 2
    doc = json.loads(pathlib.Path(args[1]).read_text())
    if args[0] == "sandbox":
        return sandbox(SandboxPlan(**{**doc, "tmpfs": tuple(doc["tmpfs"])}))
    return container(_load_container(doc))


if __name__ == "__main__":
    raise SystemExit(main())
