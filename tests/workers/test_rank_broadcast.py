"""Trainer rank 0 hands each batch to its peers as data, not pickles (issue 11, finding 10): two real
gloo ranks on loopback, with torch's object (pickle) collectives made to fail; the peer receives
exactly rank 0's groups, and an empty batch (the job stopped) arrives as an empty list."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

_RANK = """
import sys
import torch.distributed as dist
from torch.distributed import distributed_c10d

def refuse(*_a, **_k):
    raise AssertionError("an object collective was used: it unpickles what it receives")

dist.broadcast_object_list = distributed_c10d.broadcast_object_list = refuse
distributed_c10d._tensor_to_object = refuse

from plrl_workers import protocol, trainer

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
sample = protocol.Sample([5, 6, 7], [-0.5, -1.0, -2.0], [3, 3, 4], 1.0, "stop")
groups = [protocol.RolloutGroup(f"lease-{k}", k, [1, 2], [sample, sample], "gen-0") for k in range(3)]
got = trainer.broadcast_groups(groups if rank == 0 else None, rank)
assert [(g.lease_id, g.prompt_id, [list(s.token_ids) for s in g.samples]) for g in got] == [
    (g.lease_id, g.prompt_id, [list(s.token_ids) for s in g.samples]) for g in groups
], got
assert list(got[1].samples[0].versions) == [3, 3, 4] and got[2].samples[1].reward == 1.0
assert trainer.broadcast_groups([] if rank == 0 else None, rank) == []
dist.destroy_process_group()
print("ok", flush=True)
"""


def test_a_batch_reaches_the_peer_rank_without_pickle() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(r), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120)[0] for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], outs
    assert all(o.strip().endswith("ok") for o in outs), outs
