"""What both training backends share: their settings, the process group, the model and optimizer.

`create(cfg)` returns the `TrainingEngine` the spec asks for (`training.backend`). Both backends load
the model the same way (fp32 master weights; transformers names), and use the same optimizer:
`torch.optim.AdamW` (single parameter group, so weight decay also applies to norms and biases).
DeepSpeed gets that torch optimizer rather than its own CPU/fused Adam: the math is the same
AdamW, it needs no C++ op build, and it makes the two backends agree to float rounding.

The process group is the trainer ranks' default group, set up from the usual environment
(`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `LOCAL_RANK`): gloo on CPU, NCCL on CUDA, unless
`PLRL_COLLECTIVE_BACKEND` says gloo (`plrl run` sets it when processes share a GPU, which NCCL refuses;
see `local_devices.py`).

Neighbours: `engines/base.py` (the protocol), `engines/ddp_engine.py`, `engines/deepspeed_engine.py`,
`checkpoint.py` (copies the tokenizer next to saved weights).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

    from plrl_operator import spec as spec_mod
    from plrl_workers.engines import base


@dataclasses.dataclass(frozen=True)
class TrainEngineConfig:
    """The spec's `training` group as a backend needs it, plus where the initial weights are."""

    model_path: str
    backend: Literal["deepspeed", "torch"] = "torch"
    zero_stage: int = 1
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    gradient_clipping: float = 1.0
    """Global gradient-norm clip; 0 disables it (DeepSpeed is told explicitly: it defaults to 1)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype on CUDA (master weights stay fp32); CPU always computes in fp32."""
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    seed: int = 0
    attn_implementation: str = "sdpa"

    @classmethod
    def from_spec(cls, spec: spec_mod.JobSpec, model_path: str) -> TrainEngineConfig:
        t = spec.training
        return cls(
            model_path=model_path,
            backend=t.backend,
            zero_stage=t.zero_stage,
            learning_rate=t.learning_rate,
            weight_decay=t.weight_decay,
            gradient_clipping=t.gradient_clipping,
            dtype=spec.model.dtype,
            seed=t.seed,
        )


COLLECTIVE_BACKEND_ENV = "PLRL_COLLECTIVE_BACKEND"


def collective_backend() -> str:
    """The backend for the trainer group and the weight broadcast: the env's choice, else by device."""
    import torch

    chosen = os.environ.get(COLLECTIVE_BACKEND_ENV)
    if chosen:
        if chosen not in ("gloo", "nccl"):
            raise ValueError(f"{COLLECTIVE_BACKEND_ENV}={chosen!r} must be 'gloo' or 'nccl'")
        return chosen
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(timeout_s: float = 600.0) -> None:
    """Join the trainer group from the environment, or form a group of one if there is none."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = collective_backend()
    timeout = datetime.timedelta(seconds=timeout_s)
    if "WORLD_SIZE" in os.environ:
        if torch.cuda.is_available():
            torch.cuda.set_device(device())
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    else:
        store = dist.HashStore()  # type: ignore[attr-defined]  # exported at runtime, not in the stubs
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)


def device() -> torch.device:
    import torch

    if torch.cuda.is_available():
        # Modulo: ranks that share a GPU (`plrl run` on fewer GPUs than ranks) each see just one.
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def load_model(cfg: TrainEngineConfig, dev: torch.device) -> torch.nn.Module:
    """The policy in fp32 with the KV cache off (packing needs it off; see `rl/packing.py`)."""
    import torch
    import transformers

    torch.manual_seed(cfg.seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        cfg.model_path, dtype=torch.float32, attn_implementation=cfg.attn_implementation
    )
    model.config.use_cache = False
    model.to(dev)
    model.train()
    module: torch.nn.Module = model
    return module


def load_hf_weights(model: torch.nn.Module, model_dir: pathlib.Path) -> None:
    """Load every `*.safetensors` shard of a `save_pretrained` directory into `model`, strictly.

    Tied parameters are stored once, so their second name may be absent; nothing else may be.
    """
    import safetensors.torch

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(safetensors.torch.load_file(str(f), device="cpu"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    missing = [n for n in missing if not (tied and n == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{model_dir}: weights missing {missing}, unexpected {unexpected}")


def make_optimizer(params: object, cfg: TrainEngineConfig) -> torch.optim.Optimizer:
    import torch

    return torch.optim.AdamW(
        params,  # type: ignore[arg-type]
        lr=cfg.learning_rate,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
    )


def create(cfg: TrainEngineConfig) -> base.TrainingEngine:
    """Initialise the process group if needed and build the backend named by `cfg.backend`."""
    init_distributed()
    if cfg.backend == "deepspeed":
        from plrl_workers.engines import deepspeed_engine

        return deepspeed_engine.DeepSpeedEngine(cfg)
    if cfg.backend == "torch":
        from plrl_workers.engines import ddp_engine

        return ddp_engine.DDPEngine(cfg)
    raise ValueError(f"training.backend={cfg.backend!r} must be 'deepspeed' or 'torch'")
