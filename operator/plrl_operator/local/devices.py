"""`plrl run`: which GPUs each local process sees, and whether the job's collectives may use NCCL.

In a cluster every pod gets its own accelerators and sees exactly those. On one machine the runner
has to hand them out itself: without it every process would open `cuda:0` (the generator) or
`cuda:<local rank>` (trainer ranks), so on a multi-GPU machine the roles would pile onto the first
devices, and on a one-GPU machine the trainer's NCCL weight broadcast to a generator on the same
device would fail at group creation (NCCL refuses two ranks of one communicator on one GPU).

The rule is pure (`placements`):
- no GPU visible: nothing is set, the job runs on the CPU;
- at least as many GPUs as the job's accelerators (`resources.totalGPUs`): each pod gets its own,
  consecutively (trainer pods first, then generators), like a pod in a cluster, and NCCL is used;
- fewer: the job's accelerators are mapped onto the GPUs round-robin, each process sees the one
  GPU its accelerator landed on (so both roles may share a device), and the job's collectives use
  gloo (the worker config's `endpoints.collectiveBackend`): gloo moves CUDA tensors through host
  memory, which is slower but allowed for processes sharing a GPU.

Neighbours: `local.runner` (merges the env into each process, writes the backend into the configs),
`plrl_workers.engines.training` (picks the device from the local rank, modulo what it sees).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from plrl_api import plan


@dataclasses.dataclass(frozen=True)
class Placements:
    """The env each local process gets on top of its role's (empty on a CPU-only machine)."""

    trainers: tuple[Mapping[str, str], ...]
    """One per trainer rank, in rank order."""
    generators: tuple[Mapping[str, str], ...]
    """One per generator pod."""
    shared: bool
    """Processes share a GPU: the job's collectives must use gloo."""


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPU ids this machine lets us use: `CUDA_VISIBLE_DEVICES` if set, else all torch sees."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch  # `plrl run` needs the workers' packages anyway; only this module asks torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def placements(pods: plan.PodPlan, gpus: Sequence[str]) -> Placements:
    """Which GPUs every trainer rank and generator pod of `pods` sees."""
    ranks = pods.trainer_gpus
    if not gpus:
        return Placements(({},) * ranks, ({},) * pods.generator_pods, shared=False)
    needed = ranks + pods.generator_gpus
    shared = len(gpus) < needed
    # Accelerator k of the job (trainer ranks first, then generator GPUs) runs on gpus[k % n].
    slots = [gpus[k % len(gpus)] for k in range(needed)]
    trainers = []
    for rank in range(ranks):
        if shared:
            visible = slots[rank]  # one GPU per process; the engine maps its local rank onto it
        else:
            pod = rank // pods.gpus_per_trainer
            visible = ",".join(slots[pod * pods.gpus_per_trainer : (pod + 1) * pods.gpus_per_trainer])
        trainers.append({"CUDA_VISIBLE_DEVICES": visible})
    generators = []
    for k in range(pods.generator_pods):
        first = ranks + k * pods.gpus_per_generator
        own = slots[first : first + pods.gpus_per_generator]
        generators.append({"CUDA_VISIBLE_DEVICES": own[0] if shared else ",".join(own)})
    return Placements(tuple(trainers), tuple(generators), shared)
