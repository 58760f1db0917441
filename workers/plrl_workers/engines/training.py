"""What both training backends share: their settings, the process group, the model and optimizer.

`engines.factory.training_engine(cfg)` builds the backend the spec asks for (`training.backend`).
Both backends load the model the same way (fp32 master weights; transformers names), and use the
same optimizer: `torch.optim.AdamW` (single parameter group, so weight decay also applies to norms
and biases).
DeepSpeed gets that torch optimizer rather than its own CPU/fused Adam: the math is the same
AdamW, it needs no C++ op build, and it makes the two backends agree to float rounding.

The process group is the trainer ranks' default group, joined at the `Rendezvous` the worker config
names (trainer rank 0's store): gloo on CPU, NCCL on CUDA, unless the config says gloo (`plrl run`
does when processes share a GPU, which NCCL refuses; see `plrl_operator.local.devices`).

Neighbours: `engines/base.py` (the protocol), `engines/ddp_engine.py`, `engines/deepspeed_engine.py`,
`checkpoint.py` (copies the tokenizer next to saved weights).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import pathlib
import time
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch
    from torch._C import _distributed_c10d as c10d

    from plrl_api import spec as spec_mod

log = logging.getLogger("plrl.training")
REJOIN_WAIT_S = 0.5
_RANK0_UP = "rank0-up"


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
    local_rank: int = 0
    """Which of the pod's accelerators this rank drives (CUDA device index)."""
    delay_compensation: float = 0.0
    """DC-ASGD's lambda (`rl/delay_compensation.py`); 0 = off. The torch backend only."""
    max_lag: int = 8
    """pipeline.maxLag: the delay-compensated step keeps the weights of maxLag + 1 versions."""

    @classmethod
    def from_spec(cls, spec: spec_mod.JobSpec, model_path: str, local_rank: int = 0) -> TrainEngineConfig:
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
            local_rank=local_rank,
            delay_compensation=t.delay_compensation,
            max_lag=spec.pipeline.max_lag,
        )


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    """Where and as whom a trainer rank joins the default process group."""

    host: str
    port: int
    rank: int
    world_size: int
    local_rank: int = 0
    backend: str | None = None
    """"gloo" or "nccl"; None: NCCL on CUDA, gloo on CPU (`collective_backend`)."""
    bind_host: str | None = None
    """Where rank 0's store listens (None: every interface; `stores.tcp_store`)."""


def collective_backend(choice: str | None = None) -> str:
    """The backend for the trainer group and the weight broadcast: `choice`, else by device."""
    import torch

    if choice is not None:
        if choice not in ("gloo", "nccl"):
            raise ValueError(f"collective backend {choice!r} must be 'gloo' or 'nccl'")
        return choice
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(at: Rendezvous | None = None, timeout_s: float = 600.0) -> None:
    """Join the trainer group at `at`, or form a group of one (None: tests, benches, one rank)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = collective_backend(at.backend if at is not None else None)
    timeout = datetime.timedelta(seconds=timeout_s)
    if at is None:
        alone = dist.HashStore()  # type: ignore[attr-defined]  # exported at runtime, not in the stubs
        dist.init_process_group(backend, store=alone, rank=0, world_size=1, timeout=timeout)
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(device(at.local_rank))
    store = _meet_rank0(at, timeout_s)
    dist.init_process_group(backend, store=store, rank=at.rank, world_size=at.world_size, timeout=timeout)


def leave_distributed() -> None:
    """Leave the trainer group before the interpreter's teardown. Left to the teardown, destroying
    the group can abort the process (SIGABRT, "terminate called without an active exception") when
    a client is still connected to this rank 0's store: a rank of a resized group that reached it
    while this one checkpointed its last step. Not for a broken group (see `trainer.train`)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _meet_rank0(at: Rendezvous, timeout_s: float) -> c10d.PrefixStore:
    """The store of this group's rank 0, keyed by world size: a rank of a resized group that reaches
    the store of the old group's rank 0 (still checkpointing its last step, at the same address)
    waits there for a rank 0 of its own world size, and when that store goes away with its process,
    connects again, to the new rank 0's. Waited for before joining the process group: a failed
    `init_process_group` leaves torch's group counter behind, and a second try would never meet."""
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d

    from plrl_workers import stores  # imports torch, as this function does

    deadline = time.monotonic() + timeout_s
    while True:
        tcp = stores.tcp_store(
            at.host, at.port, is_master=at.rank == 0, timeout_s=timeout_s, bind_host=at.bind_host
        )
        store = c10d.PrefixStore(f"world-{at.world_size}", tcp)
        if at.rank == 0:
            store.set(_RANK0_UP, "1")
            return store
        try:
            store.wait([_RANK0_UP])
            return store
        except dist.DistError as err:
            if time.monotonic() > deadline:
                raise
            log.warning("the rendezvous store at %s:%d went away (%s); joining again", at.host, at.port, err)
            time.sleep(REJOIN_WAIT_S)


# What gloo's TCP transport says when a peer's process went away mid-collective (it raises a plain
# RuntimeError; NCCL and the c10d store raise `torch.distributed.DistError`s).
_PEER_GONE = ("gloo/transport", "Connection reset by peer", "Connection closed by peer")


def is_group_failure(err: BaseException) -> bool:
    """`err` came from the trainer group itself (a peer rank died or the store went away), not from
    this rank's own work: the group must restart as one."""
    import torch.distributed as dist

    if isinstance(err, dist.DistError):
        return True
    return isinstance(err, RuntimeError) and any(s in str(err) for s in _PEER_GONE)


def device(local_rank: int = 0) -> torch.device:
    import torch

    if torch.cuda.is_available():
        # Modulo: ranks that share a GPU (`plrl run` on fewer GPUs than ranks) each see just one.
        return torch.device("cuda", local_rank % torch.cuda.device_count())
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


def save_hf_model(model: torch.nn.Module, out_dir: pathlib.Path) -> None:
    """Write what `save_pretrained` writes for a model that is not wrapped: `config.json`,
    `generation_config.json` (if it has one) and `model.safetensors`, a tensor shared with an
    earlier one (a tied lm_head) stored once, as `save_pretrained` stores it.

    Why not `save_pretrained`: it first unwraps the model through accelerate, which imports
    DeepSpeed whenever it is installed, seconds of CPU on the first checkpoint of a run, and of every
    stop (a trainer told to stop checkpoints before it exits), that the torch backend never needs.
    """
    import safetensors.torch

    out_dir.mkdir(parents=True, exist_ok=True)
    config = getattr(model, "config", None)
    if config is not None:
        config.architectures = [type(model).__name__]
        config.save_pretrained(str(out_dir))
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(str(out_dir))
    state: dict[str, torch.Tensor] = {}
    stored: set[tuple[int, int, tuple[int, ...]]] = set()
    for name, tensor in model.state_dict().items():
        where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if where in stored:
            continue
        stored.add(where)
        state[name] = tensor.detach().to("cpu").contiguous()
    safetensors.torch.save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


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
