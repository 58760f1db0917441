"""A trainer rank whose peer died mid-collective sees a group failure (`training.is_group_failure`),
which makes it exit `EXIT_RESTART_ME` so the whole group restarts from its checkpoint, uncharged.

Two real gloo ranks in subprocesses: rank 1 joins and exits at once; rank 0's next all-reduce and
its next object broadcast both fail, and both errors are read as the group breaking. An error of
the rank's own work (a ValueError, a RuntimeError about something else) is not.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from plrl_workers.engines import training
from tests.infra import procs

RANK = """
import datetime, json, os, sys
import torch, torch.distributed as dist
from plrl_workers.engines import training

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
if rank == 1:
    os._exit(137)  # a rank killed mid-run
seen = []
for attempt in (lambda: dist.all_reduce(torch.ones(4)), lambda: dist.broadcast_object_list([1], src=0)):
    try:
        attempt()
        seen.append(None)
    except RuntimeError as err:
        seen.append([type(err).__name__, training.is_group_failure(err)])
print(json.dumps(seen), flush=True)
# As the trainer leaves a broken group (`lifecycle.exit_now`): the group's destructors may abort the
# interpreter's teardown ("terminate called without an active exception").
os._exit(0)
"""


def test_a_dead_peer_breaks_the_group_and_is_told_apart_from_own_errors() -> None:
    port = procs.free_port()
    rank1 = subprocess.Popen([sys.executable, "-c", RANK, "1", str(port)])
    rank0 = subprocess.run(
        [sys.executable, "-c", RANK, "0", str(port)], capture_output=True, text=True, timeout=120
    )
    assert rank1.wait(timeout=60) == 137
    assert rank0.returncode == 0, rank0.stderr[-2000:]
    seen = json.loads(rank0.stdout.strip().splitlines()[-1])
    assert len(seen) == 2 and all(s is not None and s[1] for s in seen), seen


@pytest.mark.parametrize(
    "err", [ValueError("bad batch"), RuntimeError("CUDA out of memory"), KeyError("weight")]
)
def test_errors_of_the_ranks_own_work_are_not_group_failures(err: BaseException) -> None:
    assert not training.is_group_failure(err)
