"""DeepSpeed ZeRO-1/2 behind `TrainingEngine` (spec `training.backend: deepspeed`).

Choices, each because the default would be wrong for us:
- `gradient_clipping` is always set from the spec (0 = off): DeepSpeed's own default is 1.0.
- The optimizer is a `torch.optim.AdamW` handed to `deepspeed.initialize` (with
  `zero_allow_untested_optimizer`): ZeRO partitions its state like its own Adam's, the update is
  the same AdamW, and nothing is compiled (DeepSpeedCPUAdam builds a C++ op on first use).
- `managed_gradient_accumulation: false`: the number of micro-batches per step varies with packing,
  so the caller, not a fixed `gradient_accumulation_steps`, owns the boundary: `backward()` only
  accumulates and `step()` reduces (ZeRO-2 reduce-scatters in every backward, which is why every
  rank runs the same number of micro-batches) and updates. Losses are not rescaled by DeepSpeed
  (`scale_wrt_gas=False`); DeepSpeed averages gradients over ranks like DDP.
- On the CPU accelerator DeepSpeed's torch backend JIT-builds a shared-memory all-reduce op at
  init (`deepspeed_shm_comm`; measured ~8 min on a busy 2-core machine). It only serves
  inference all-reduce when `LOCAL_SIZE` is set, which training never uses, so it is marked
  incompatible through `deepspeed.ops.__compatible_ops__` (a dict DeepSpeed documents as
  editable) and not built. Any op that is still built lands in `TORCH_EXTENSIONS_DIR`, which
  defaults to `~/.cache/plrl/torch_extensions` (`machine_cache`) so it is built once per machine.

Checkpoints: `model/` (HF `save_pretrained`, rank 0, for generators), `deepspeed/` (DeepSpeed's own
checkpoint: per-rank ZeRO optimizer partitions), `engine.json` (version, world size, ZeRO stage,
DeepSpeed tag, the partition files). At the world size that wrote it, DeepSpeed's own loader
restores it; at another (the autoscaler's elastic restart), DeepSpeed loads the weights and
`engines/zero_reshard.py` re-cuts the saved optimizer partitions for the new ranks, exactly.

Neighbours: `engines/base.py`, `engines/training.py`, `engines/ddp_engine.py`, `engines/zero_reshard.py`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from plrl_workers import machine_cache
from plrl_workers.engines import training, zero_reshard

_TAG = "state"


def _prepare_deepspeed_import() -> Any:
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(machine_cache.home() / "torch_extensions"))
    import deepspeed
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    deepspeed.utils.logger.setLevel(logging.WARNING)
    if get_accelerator().device_name() == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


def _saved_partitions(directory: pathlib.Path, meta: dict[str, Any]) -> list[pathlib.Path]:
    """The ZeRO partition files of the checkpoint in `directory`, in saved-rank order; raise unless
    every saved rank's is there."""
    world = int(meta["world_size"])
    if "partitions" not in meta:  # written before engine.json listed them: find them by DeepSpeed's names
        return zero_reshard.partition_files(
            directory / "deepspeed" / meta.get("tag", _TAG), str(directory), world
        )
    files = [directory / f for f in meta["partitions"]]
    absent = [f.name for f in files if not f.is_file()]
    if absent or len(files) != world:
        raise ValueError(
            f"checkpoint {directory}: written by {world} ranks, but of its ZeRO partition files "
            f"{meta['partitions']} these are missing: {absent}; the optimizer state is incomplete"
        )
    return files


class DeepSpeedEngine:
    """`TrainingEngine` over a DeepSpeed ZeRO-1/2 engine."""

    def __init__(self, cfg: training.TrainEngineConfig) -> None:
        if not dist.is_initialized():
            raise RuntimeError("call engines.training.init_distributed() before building an engine")
        if cfg.zero_stage not in (1, 2):
            raise ValueError(f"training.zeroStage={cfg.zero_stage} must be 1 or 2")
        if cfg.delay_compensation > 0:
            # ZeRO keeps each rank's share of the reduced gradients inside its optimizer wrapper.
            raise ValueError("training.delayCompensation needs training.backend=torch")
        deepspeed = _prepare_deepspeed_import()
        self._cfg = cfg
        self._device = training.device(cfg.local_rank)
        # DeepSpeed reads the rank layout from the environment its own launcher would set; our ranks
        # joined the process group themselves (`training.init_distributed`), so say it as the group does.
        os.environ["LOCAL_RANK"] = str(cfg.local_rank)
        os.environ["RANK"] = str(dist.get_rank())
        os.environ["WORLD_SIZE"] = str(dist.get_world_size())
        deepspeed.init_distributed(dist_backend=dist.get_backend())
        self._rank = dist.get_rank()
        self._world = dist.get_world_size()
        model = training.load_model(cfg, self._device)
        optimizer = training.make_optimizer(model.parameters(), cfg)
        half = self._device.type == "cuda" and cfg.dtype != "float32"
        ds_config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "gradient_clipping": float(cfg.gradient_clipping),
            "zero_optimization": {"stage": cfg.zero_stage},
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": half and cfg.dtype == "bfloat16"},
            "fp16": {"enabled": half and cfg.dtype == "float16"},
            "steps_per_print": 2**62,
            "wall_clock_breakdown": False,
        }
        self._engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self._version = 0

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def version(self) -> int:
        return self._version

    def train_micro_batch(
        self,
        compute_loss: Callable[[torch.nn.Module], tuple[torch.Tensor, dict[str, float]]],
        *,
        last: bool,
    ) -> dict[str, float]:
        del last  # step() is the boundary (managed_gradient_accumulation=false)
        loss, metrics = compute_loss(self._engine)
        self._engine.backward(loss, scale_wrt_gas=False)
        return metrics

    def step(self, behaviour_version: int | None = None) -> dict[str, float]:
        del behaviour_version  # no delay compensation here: the spec allows it with backend torch only
        self._engine.step()
        self._version += 1
        norm = self._engine.get_global_grad_norm()
        grad_norm = float(norm) if norm is not None else math.nan
        return {"grad_norm": grad_norm, "lr": float(self._engine.get_lr()[0])}

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        # ZeRO-1/2 partition optimizer state and gradients, never parameters: each rank has them all.
        for name, p in self._engine.module.named_parameters():
            yield name, p.detach()

    def save_checkpoint(self, directory: pathlib.Path) -> None:
        self._engine.save_checkpoint(str(directory / "deepspeed"), tag=_TAG, save_latest=False)
        if self._rank == 0:
            self._engine.module.save_pretrained(str(directory / "model"), safe_serialization=True)
            # DeepSpeed's save ends in a barrier, so every rank's partition file is there to list.
            tag_dir = directory / "deepspeed" / _TAG
            files = zero_reshard.partition_files(tag_dir, str(directory), self._world)
            meta = {
                "backend": "deepspeed",
                "version": self._version,
                "world_size": self._world,
                "zero_stage": self._cfg.zero_stage,
                "tag": _TAG,
                "partitions": [str(f.relative_to(directory)) for f in files],
            }
            (directory / "engine.json").write_text(json.dumps(meta))

    def load_checkpoint(self, directory: pathlib.Path) -> None:
        meta = json.loads((directory / "engine.json").read_text())
        tag = meta.get("tag", _TAG)  # checkpoints from before the elastic load did not record it
        recut = None
        if int(meta["world_size"]) != self._world:
            # Read and re-cut before DeepSpeed loads anything: a checkpoint that does not fit is
            # refused with the engine as it was.
            files = _saved_partitions(directory, meta)
            recut = zero_reshard.read(self._engine.optimizer, files, str(directory))
        # DeepSpeed's loader refuses optimizer state from another DP size: across sizes it loads the
        # weights and step counters only, and the re-cut partitions replace its fp32 copy after it.
        path, _ = self._engine.load_checkpoint(
            str(directory / "deepspeed"),
            tag=tag,
            load_optimizer_states=recut is None,
            load_lr_scheduler_states=False,
        )
        if path is None:
            raise FileNotFoundError(f"{directory / 'deepspeed'}: no DeepSpeed checkpoint with tag {tag!r}")
        if recut is not None:
            zero_reshard.install(self._engine.optimizer, recut)
        self._version = int(meta["version"])

    def close(self) -> None:
        self._engine.destroy()
