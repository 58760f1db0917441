"""Conventional RL, the baseline every comparison uses: every worker generates, then every worker trains.

`pipeline.mode: conventional` runs the same parts as pipeline mode, colocated and alternating: each
of the N accelerators is one trainer rank that also owns a generation engine. A round opens B/G
prompts in the coordinator (trainer rank 0), all ranks decode them with their engines (continuous
batching, H per accelerator) and stream the rollouts to the coordinator, then all ranks train one
optimizer step on them and load the new weights into their own engines in process. There is no
lag (every token comes from the current weights) and no weight broadcast, and each phase waits
for the slowest worker: exactly the costs pipelining removes.

Neighbours: `trainer.TrainLoop` (training, coordinator, checkpoints), `generator.Generator`
(decoding and rollout delivery), `plrl_operator.local.runner` (starts these processes for `plrl run`).
"""

from __future__ import annotations

import logging
import threading

import torch.distributed as dist

from plrl_api import identity, worker_config
from plrl_workers import generator, lifecycle, trainer
from plrl_workers.engines import training


def run(cfg: worker_config.WorkerConfig, ident: identity.Identity, ranks: trainer.RankInfo) -> int:
    stop = threading.Event()
    lifecycle.on_sigterm(stop.set)
    # Budget 0: nothing is issued until a round opens.
    loop = trainer.TrainLoop(cfg, ident, ranks, stop, prompt_budget=0)
    dist.barrier()  # the coordinator (rank 0) is serving before any generator registers
    gen, capacity = generator.build(cfg, ident, name=f"{cfg.job.name}-worker-{ranks.rank}", gpus=1)
    try:
        if loop.engine.version > gen.engine.weight_version:  # resumed: start from the trained weights
            gen.engine.update_weights(loop.engine.named_parameters_for_sync(), loop.engine.version)
        if not gen.start():  # rank 0 serves the coordinator: it cannot go away while this rank lives
            raise RuntimeError("the coordinator went away while this rank's generator started")
        while not loop.done and not stop.is_set():
            if loop.hub is not None:
                trained = loop.hub.coord.stats().accounting.trained
                loop.hub.coord.set_prompt_budget(trained + loop.n_groups)
            dist.barrier()
            gen.generate_round(capacity)
            dist.barrier()  # every rank's rollouts are in the coordinator's buffer
            if not loop.train_one():
                break
            gen.engine.update_weights(loop.engine.named_parameters_for_sync(), loop.engine.version)
        gen.close()
        dist.barrier()  # generators are gone before rank 0 stops the coordinator
    finally:
        gen.engine.close()
        gen.coord.close()
        loop.close()
    training.leave_distributed()
    return 0 if loop.done or stop.is_set() else 1


def main(cfg: worker_config.WorkerConfig, ident: identity.Identity, argv: list[str]) -> int:
    """The trainer role when `pipeline.mode` is conventional (`plrl-worker --role trainer`)."""
    gpus = cfg.pods().gpus_per_trainer
    if ident.local_rank is None and gpus > 1:
        return trainer.spawn_local_ranks(argv, gpus)
    ranks = trainer.RankInfo.of(cfg, ident)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{ranks.rank} %(name)s %(levelname)s %(message)s"
    )
    return run(cfg, ident, ranks)
