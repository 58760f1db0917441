"""`plrl run`: which GPUs each local process sees, and whether its collectives may use NCCL.

In a cluster every pod gets its own accelerators and sees exactly those. On one machine the runner
has to hand them out itself: without it every process would open `cuda:0` (the generator) or
`cuda:LOCAL_RANK` (trainer ranks), so on a multi-GPU machine the roles would pile onto the first
devices, and on a one-GPU machine the trainer's NCCL weight broadcast to a generator on the same
device would fail at group creation (NCCL refuses two ranks of one communicator on one GPU).

The rule is pure (`placements`):
- no GPU visible: nothing is set, the job runs on the CPU as before;
- at least as many GPUs as the job's accelerators (`resources.totalGPUs`): each pod gets its own,
  consecutively (trainer pods first, then generators), like a pod in a cluster, and NCCL is used;
- fewer: the job's accelerators are mapped onto the GPUs round-robin, each process sees the one
  GPU its accelerator landed on (so both roles may share a device), and every collective uses
  gloo (`training.COLLECTIVE_BACKEND_ENV`): gloo moves CUDA tensors through host memory, which is
  slower but allowed for processes sharing a GPU.

Neighbours: `local.py` (merges these env vars into each process), `engines/training.py` and
`trainer.py` (read the collective backend), `generator.py` (uses "cuda" = its first visible GPU).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from plrl_workers.engines import training


@dataclasses.dataclass(frozen=True)
class Placement:
    """The env one local process gets on top of its role's env (empty on a CPU-only machine)."""

    env: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class Pods:
    """The local processes of a job, grouped as pods: (ranks in the pod, accelerators of the pod)."""

    trainer_pods: int
    gpus_per_trainer: int
    generator_pods: int
    gpus_per_generator: int


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPU ids this machine lets us use: `CUDA_VISIBLE_DEVICES` if set, else all torch sees."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def placements(pods: Pods, gpus: Sequence[str]) -> tuple[list[Placement], list[Placement]]:
    """(one Placement per trainer rank in rank order, one per generator pod)."""
    trainer_ranks = pods.trainer_pods * pods.gpus_per_trainer
    if not gpus:
        return [Placement({})] * trainer_ranks, [Placement({})] * pods.generator_pods
    needed = trainer_ranks + pods.generator_pods * pods.gpus_per_generator
    shared = len(gpus) < needed
    # Accelerator k of the job (trainer ranks first, then generator GPUs) runs on gpus[k % n].
    slots = [gpus[k % len(gpus)] for k in range(needed)]
    extra = {training.COLLECTIVE_BACKEND_ENV: "gloo"} if shared else {}
    trainers = []
    for rank in range(trainer_ranks):
        if shared:
            # One visible GPU per process; `training.device()` maps LOCAL_RANK onto it.
            visible = slots[rank]
        else:
            pod = rank // pods.gpus_per_trainer
            visible = ",".join(slots[pod * pods.gpus_per_trainer : (pod + 1) * pods.gpus_per_trainer])
        trainers.append(Placement({"CUDA_VISIBLE_DEVICES": visible, **extra}))
    generators = []
    for k in range(pods.generator_pods):
        first = trainer_ranks + k * pods.gpus_per_generator
        own = slots[first : first + pods.gpus_per_generator]
        visible = own[0] if shared else ",".join(own)
        generators.append(Placement({"CUDA_VISIBLE_DEVICES": visible, **extra}))
    return trainers, generators
