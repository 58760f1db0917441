"""Plain torch DistributedDataParallel behind `TrainingEngine` (spec `training.backend: torch`).

Every rank holds the whole model and optimizer. Gradients of the micro-batches before the last are
accumulated locally (`DDP.no_sync`); the last backward all-reduces them (DDP averages over ranks).
Clipping uses `torch.nn.utils.clip_grad_norm_` on the reduced gradients (identical on every rank).
On CUDA with dtype bfloat16/float16 the forward runs under autocast; weights stay fp32.

Checkpoint layout inside the directory `checkpoint.py` gives it: `model/` (what HF
`save_pretrained` writes, by `training.save_hf_model`, rank 0), `optimizer.pt` (rank 0: the
optimizer state is replicated, so it holds all of it and loads at any world size: an elastic
restart), `engine.json` (version, world size).

With `training.delayCompensation` the step corrects the reduced gradients for the batch's lag
(DC-ASGD, `rl/delay_compensation.py`) before clipping, from the weights of the batch's behaviour
version kept in a `WeightHistory` (maxLag + 1 copies of the parameters on the device).

Neighbours: `engines/base.py`, `engines/training.py`, `engines/deepspeed_engine.py`.
"""

from __future__ import annotations

import contextlib
import json
import math
import pathlib
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from plrl_workers.engines import training
from plrl_workers.rl import delay_compensation


class DDPEngine:
    """`TrainingEngine` over torch DDP (gloo on CPU, NCCL on CUDA)."""

    def __init__(self, cfg: training.TrainEngineConfig) -> None:
        if not dist.is_initialized():
            raise RuntimeError("call engines.training.init_distributed() before building an engine")
        self._cfg = cfg
        self._rank = dist.get_rank()
        self._world = dist.get_world_size()
        self._device = training.device(cfg.local_rank)
        self._model = training.load_model(cfg, self._device)
        self._ddp = DistributedDataParallel(
            self._model,
            device_ids=[self._device.index] if self._device.type == "cuda" else None,
            # Buffers (rotary tables) are identical on every rank; syncing them per forward is waste.
            forward_sync_buffers=False,
        )
        self._opt = training.make_optimizer(self._model.parameters(), cfg)
        self._version = 0
        self._history: delay_compensation.WeightHistory | None = None
        if cfg.delay_compensation > 0:
            self._history = delay_compensation.WeightHistory(cfg.max_lag + 1)
            self._history.record(self._version, self._model.parameters())
        use_amp = self._device.type == "cuda" and cfg.dtype != "float32"
        self._amp_dtype = getattr(torch, cfg.dtype) if use_amp else None

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
        sync = contextlib.nullcontext() if last else self._ddp.no_sync()
        amp = (
            torch.autocast(self._device.type, dtype=self._amp_dtype)
            if self._amp_dtype is not None
            else contextlib.nullcontext()
        )
        with sync:
            with amp:
                loss, metrics = compute_loss(self._ddp)
            torch.autograd.backward(loss)
        return metrics

    def step(self, behaviour_version: int | None = None) -> dict[str, float]:
        out: dict[str, float] = {}
        if self._history is not None and behaviour_version is not None:
            out = self._compensate_delay(behaviour_version)
        params = [p for p in self._model.parameters() if p.grad is not None]
        clip = self._cfg.gradient_clipping
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        self._opt.step()
        self._opt.zero_grad(set_to_none=True)
        self._version += 1
        if self._history is not None:
            self._history.record(self._version, self._model.parameters())
        grad_norm = float(norm)
        return out | {
            "grad_norm": grad_norm if math.isfinite(grad_norm) else math.nan,
            "lr": self._cfg.learning_rate,
        }

    def _compensate_delay(self, behaviour_version: int) -> dict[str, float]:
        """DC-ASGD on the reduced gradients; reports the lag it corrected for and, when the history
        lacked the batch's version (just after a resume), how far off the version it used was."""
        assert self._history is not None
        found, old = self._history.weights(behaviour_version)
        lam = self._cfg.delay_compensation
        with torch.no_grad():
            for p, w_b in zip(self._model.parameters(), old, strict=True):
                if p.grad is not None:
                    p.grad.copy_(delay_compensation.compensate(p.grad, p, w_b, lam))
        return {
            "dc_lag": float(self._version - found),
            "dc_version_miss": float(abs(found - behaviour_version)),
        }

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in self._model.named_parameters():
            yield name, p.detach()

    def save_checkpoint(self, directory: pathlib.Path) -> None:
        if self._rank == 0:
            training.save_hf_model(self._model, directory / "model")
            torch.save(self._opt.state_dict(), directory / "optimizer.pt")
            (directory / "engine.json").write_text(
                json.dumps({"backend": "torch", "version": self._version, "world_size": self._world})
            )

    def load_checkpoint(self, directory: pathlib.Path) -> None:
        training.load_hf_weights(self._model, directory / "model")
        opt_state = torch.load(directory / "optimizer.pt", map_location=self._device, weights_only=True)
        self._opt.load_state_dict(opt_state)
        self._version = int(json.loads((directory / "engine.json").read_text())["version"])
        if self._history is not None:  # older versions' weights are gone with the old process
            self._history = delay_compensation.WeightHistory(self._cfg.max_lag + 1)
            self._history.record(self._version, self._model.parameters())

    def close(self) -> None:
        self._opt.zero_grad(set_to_none=True)
