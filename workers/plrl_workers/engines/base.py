"""The contracts of the engine adapters: `GenerationEngine` (`torch`, `vllm`) and `TrainingEngine`
(`deepspeed`, `torch` DDP), each tested by one suite that every implementation passes.

The generator role (`plrl_workers.generator`) drives an engine one `step()` at a time and applies
weight updates between steps, so an update never interrupts a decode step and in-flight sequences
keep their KV cache. Logprobs are defined once, in `engines/sampling.py`. Neighbours:
`engines/torch_engine.py`, `engines/vllm_engine.py`, `weight_sync/` (where update tensors come
from). The trainer role drives a `TrainingEngine` one micro-batch at a time
(`rl/step.py:train_step`); implementations: `engines/deepspeed_engine.py`, `engines/ddp_engine.py`,
both built by `engines/factory.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import pathlib
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import torch

    from plrl_workers import protocol


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """What an engine needs to decode one sequence."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclasses.dataclass
class FinishedSequence:
    """A completed sequence as an engine reports it.

    `versions[i]` is the weight version that produced `token_ids[i]`, and `logprobs[i]` its
    log-probability under that version (the behaviour policy). With in-flight updates the versions
    inside one sequence may differ.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # "stop" (EOS/stop token) or "length"

    def check(self) -> None:
        """Raise ValueError if the per-token arrays disagree or hold non-finite logprobs."""
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"sequence {self.request_id}: {n} tokens but {len(self.logprobs)} logprobs "
                f"and {len(self.versions)} versions"
            )
        if not all(math.isfinite(x) and x <= 0.0 for x in self.logprobs):
            raise ValueError(f"sequence {self.request_id}: logprobs must be finite and <= 0")


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """What both engines are built from (the generator derives it from the job spec)."""

    model_dir: str
    """A Hugging Face model directory (config, safetensors, tokenizer)."""
    max_concurrent: int
    """H: sequences decoded at once (torch: KV slots; vLLM: `max_num_seqs`)."""
    max_model_len: int | None = None
    """Longest prompt + completion in tokens (None: the model's `max_position_embeddings`)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    """torch engine only ("cpu", "cuda", "cuda:1"); vLLM uses its platform's device."""
    seed: int = 0
    """Seeds requests that carry no seed of their own."""
    gpu_memory_utilization: float = 0.85
    """vLLM on GPU: fraction of accelerator memory for weights and KV cache."""
    kv_cache_memory_bytes: int | None = None
    """vLLM: KV cache size; None on CPU sizes it for H full-length sequences (vLLM's CPU default,
    a fraction of host RAM minus the process's RSS, fails to start on small machines)."""
    tensor_parallel_size: int = 1
    """vLLM: accelerators per engine."""
    enforce_eager: bool = False
    """vLLM: skip CUDA graphs / torch.compile (faster start, slower decode)."""


def validate_request(
    request_id: str,
    prompt_token_ids: list[int],
    params: SamplingParams,
    max_model_len: int,
    live: Collection[str],
) -> None:
    """The checks `add_request` makes in both engines; raises ValueError naming the field."""
    if request_id in live:
        raise ValueError(f"request_id {request_id!r} is already in flight")
    if not prompt_token_ids:
        raise ValueError(f"request {request_id}: prompt_token_ids is empty")
    if params.max_new_tokens < 1:
        raise ValueError(f"request {request_id}: max_new_tokens={params.max_new_tokens} must be >= 1")
    if params.temperature < 0 or not 0 < params.top_p <= 1:
        raise ValueError(
            f"request {request_id}: temperature={params.temperature} must be >= 0 and "
            f"top_p={params.top_p} in (0, 1]"
        )
    if len(prompt_token_ids) + params.max_new_tokens > max_model_len:
        raise ValueError(
            f"request {request_id}: prompt ({len(prompt_token_ids)} tokens) + max_new_tokens "
            f"({params.max_new_tokens}) exceeds max_model_len={max_model_len}"
        )


def drain(stream: Iterator[object]) -> None:
    """Consume the rest of a broadcast after a failed load, so the sender's collectives still
    complete for the other members (a broken stream just stops)."""
    with contextlib.suppress(Exception):
        for _ in stream:
            pass


def check_version(current: int, new: int, in_flight: int = 1) -> None:
    """Weight versions never go back while sequences are in flight (their later tokens would carry
    an older version than their earlier ones; a re-sent version is allowed: it reloads). An idle
    engine may go back: a trainer restarted from an earlier checkpoint resumes at its version."""
    if new < current and in_flight:
        raise ValueError(
            f"update_weights: version {new} is older than the engine's {current} "
            f"with {in_flight} sequences in flight"
        )


class GenerationEngine(Protocol):
    """Continuous batching: requests join and leave between steps; weights change between steps."""

    @property
    def weight_version(self) -> int:
        """Version of the weights the next step decodes with (0 = initial weights)."""
        ...

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a sequence; it starts decoding at the next step (prefill included)."""
        ...

    def step(self) -> list[FinishedSequence]:
        """Advance every in-flight sequence by one token; return the ones that finished."""
        ...

    def num_in_flight(self) -> int:
        """Sequences added and not yet returned by `step()`."""
        ...

    def abort(self, request_id: str) -> None:
        """Drop an in-flight sequence (its tokens are discarded, it is never returned).

        Unknown or already finished ids are ignored, so an abort may race with completion."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights in place, keeping in-flight sequences and their KV cache.

        Names are the trainer's (transformers) parameter names; tied weights may be sent under
        either name. vLLM fuses layers (qkv, gate/up), so send every parameter of a layer you
        touch (the trainer always sends them all). Tokens decoded from the next step on are
        attributed to `version`, which must not be older than `weight_version` while sequences are
        in flight (an idle engine may go back, for a trainer resumed from an earlier checkpoint).
        If it raises midway, the version is not bumped and the weights may be a mix: load a full
        set next.
        """
        ...

    def join_weight_group(self, group: protocol.GroupInfo) -> None:
        """Join the trainer's broadcast group, leaving a different one first (no-op if already in
        `group`). vLLM joins inside each of its workers, so tensors never cross processes."""
        ...

    def receive_weights(self, ann: protocol.Announcement) -> None:
        """Receive the broadcast `ann` announces and load it as `update_weights` would.

        If it fails midway (`groups.GroupAborted` comes before any tensor; a dead peer may come
        after some), the version is not bumped and the engine may hold a mix of two versions:
        leave the group and load full weights (`update_weights`) before trusting its logprobs."""
        ...

    def leave_weight_group(self) -> None:
        """Leave the broadcast group (no-op when not in one)."""
        ...

    def close(self) -> None:
        """Release the engine's processes and memory."""
        ...


class TrainingEngine(Protocol):
    """Data-parallel training of one model: micro-batches accumulate into one optimizer step.

    Every rank of the trainer group calls every method in the same order (they are collective),
    with the same number of micro-batches per step (`rl/packing.py:plan` pads to that). Gradients
    are averaged over ranks, so each rank's loss must already be scaled to undo that mean
    (`MicroBatch.grad_scale`); then the update does not depend on the number of ranks.
    """

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def version(self) -> int:
        """Optimizer steps applied so far (the weight version generators see after a sync)."""
        ...

    def train_micro_batch(
        self,
        compute_loss: Callable[[torch.nn.Module], tuple[torch.Tensor, dict[str, float]]],
        *,
        last: bool,
    ) -> dict[str, float]:
        """Forward through the wrapped model (`compute_loss(module)`), backward, accumulate.

        `last` marks the step's final micro-batch, where the backend may reduce gradients.
        Returns the metrics `compute_loss` returned.
        """
        ...

    def step(self, behaviour_version: int | None = None) -> dict[str, float]:
        """Clip (spec `training.gradientClipping`, 0 = off), apply the optimizer, zero the gradients,
        and bump `version`. Returns at least `grad_norm` (before clipping) and `lr`.

        `behaviour_version`: the version the batch was sampled by (its mean token version), for a
        delay-compensated step (`training.delayCompensation`); ignored when that is off."""
        ...

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) parameters under their transformers names, for weight sync.

        Tied parameters appear once (e.g. no `lm_head.weight` when embeddings are tied). The
        tensors are the live parameters, detached: read them before the next `step()`.
        """
        ...

    def save_checkpoint(self, directory: pathlib.Path) -> None:
        """Collective: write model (HF format, rank 0), optimizer state and version under `directory`."""
        ...

    def load_checkpoint(self, directory: pathlib.Path) -> None:
        """Collective: restore what `save_checkpoint` wrote (same world size for DeepSpeed)."""
        ...

    def close(self) -> None:
        """Release the backend's resources (the process group stays; its owner destroys it)."""
        ...
