"""A resized trainer group meets at its new world size even when a new rank comes up while the old
group's rank 0 is still checkpointing its last step (`training.init_distributed`).

On a cluster, scaling the trainers from one rank to two creates `train-1` at once, while `train-0`
of the old group (world size 1) still holds the rendezvous store at the same address until it
exits. Three real processes: the old rank 0, a new rank 1 of world size 2 that reaches the old
store, and the new rank 0, started at the same address once the old one has exited. The new rank 1
must neither join the old group nor fail, but meet the new rank 0.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import psutil

from tests.infra import procs
from tests.polling import eventually

RANK = """
import os, sys, time
import torch, torch.distributed as dist
from plrl_workers.engines import training

rank, world, port, old = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "old"
at = training.Rendezvous("127.0.0.1", port, rank, world, backend="gloo", bind_host="127.0.0.1")
training.init_distributed(at, timeout_s=60)
print("joined", flush=True)
if old:  # the old group's rank 0, checkpointing its last step until the test lets it go on
    while not os.path.exists(sys.argv[5]):
        time.sleep(0.05)
t = torch.ones(1)
dist.all_reduce(t)
print(f"sum {int(t.item())}", flush=True)
training.leave_distributed()  # as the trainer does: its store may still have the new rank 1 connected
"""


def _rank(rank: int, world: int, port: int, release: pathlib.Path | None = None) -> subprocess.Popen[str]:
    """A trainer rank; the old group's rank 0 (`release` given) holds its store until that file exists."""
    old = [] if release is None else ["old", str(release)]
    return subprocess.Popen(
        [sys.executable, "-c", RANK, str(rank), str(world), str(port), *(old or ["new"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _connected(pid: int, port: int) -> bool:
    return any(
        c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
        for c in psutil.Process(pid).net_connections()
    )


def test_a_new_rank_that_reaches_the_old_groups_store_waits_and_meets_the_new_group(
    tmp_path: pathlib.Path,
) -> None:
    port, release = procs.free_port(), tmp_path / "checkpointed"
    started: list[subprocess.Popen[str]] = []
    try:
        old = _rank(0, 1, port, release)
        started.append(old)
        assert old.stdout is not None and old.stdout.readline().strip() == "joined"
        new1 = _rank(1, 2, port)
        started.append(new1)
        eventually(
            lambda: _connected(new1.pid, port), timeout_s=90, what="the new rank 1 to reach the old store"
        )
        release.touch()  # the old rank 0 is done checkpointing and exits
        old_out, old_err = old.communicate(timeout=60)
        assert old.returncode == 0 and old_out.strip() == "sum 1", old_err[-2000:]  # still a group of one
        assert new1.poll() is None, new1.communicate()[1][-2000:]  # waiting, not failed
        new0 = _rank(0, 2, port)
        started.append(new0)
        out0, err0 = new0.communicate(timeout=90)
        out1, err1 = new1.communicate(timeout=30)
        assert new0.returncode == 0 and out0.split() == ["joined", "sum", "2"], (err0[-1500:], err1[-1500:])
        assert new1.returncode == 0 and out1.split() == ["joined", "sum", "2"], err1[-2000:]
        assert "went away" in err1 and "joining again" in err1, err1[-2000:]
    finally:
        for p in started:  # a failure above must not leave ranks behind for the next tests
            if p.poll() is None:
                p.kill()
            p.communicate()
