"""Building engines: the one place that maps a spec's engine name to an adapter class.

Heavy imports (torch, vLLM, DeepSpeed) happen inside these functions, so importing the engine
contracts (`engines/base.py`) or settings (`engines/training.py`) stays cheap.
Neighbours: `engines/base.py` (the protocols both return), the generator and trainer roles (callers).
"""

from __future__ import annotations

from typing import Literal

from plrl_workers.engines import base, training


def generation_engine(kind: Literal["torch", "vllm"], options: base.EngineOptions) -> base.GenerationEngine:
    """The generation engine `generation.engine` names."""
    if kind == "torch":
        from plrl_workers.engines import torch_engine

        return torch_engine.TorchEngine(options)
    if kind == "vllm":
        from plrl_workers.engines import vllm_engine

        return vllm_engine.VllmEngine(options)
    raise ValueError(f"generation.engine={kind!r} must be 'torch' or 'vllm'")


def training_engine(cfg: training.TrainEngineConfig) -> base.TrainingEngine:
    """The training backend `training.backend` names; the process group must be joined first
    (`training.init_distributed`)."""
    if cfg.backend == "deepspeed":
        from plrl_workers.engines import deepspeed_engine

        return deepspeed_engine.DeepSpeedEngine(cfg)
    if cfg.backend == "torch":
        from plrl_workers.engines import ddp_engine

        return ddp_engine.DDPEngine(cfg)
    raise ValueError(f"training.backend={cfg.backend!r} must be 'deepspeed' or 'torch'")
