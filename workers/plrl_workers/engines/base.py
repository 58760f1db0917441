"""The contracts of the engine adapters: `GenerationEngine` (`torch`, `vllm`) and `TrainingEngine`
(`deepspeed`, `torch` DDP), each tested by one suite that every implementation passes.

The generator role (`plrl_workers.generator`) drives an engine one `step()` at a time and applies
weight updates between steps, so an update never interrupts a decode step and in-flight sequences
keep their KV cache. Neighbours: `engines/torch_engine.py`, `engines/vllm_engine.py`,
`weight_sync/` (where update tensors come from). The trainer role drives a `TrainingEngine` one
micro-batch at a time (`rl/step.py:train_step`); implementations: `engines/deepspeed_engine.py`,
`engines/ddp_engine.py`, built by `engines/training.py:create`.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from plrl_workers import types

if TYPE_CHECKING:
    import torch


class GenerationEngine(Protocol):
    """Continuous batching: requests join and leave between steps; weights change between steps."""

    @property
    def weight_version(self) -> int:
        """Version of the weights the next step decodes with (0 = initial weights)."""
        ...

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: types.SamplingParams) -> None:
        """Queue a sequence; it starts decoding at the next step (prefill included)."""
        ...

    def step(self) -> list[types.FinishedSequence]:
        """Advance every in-flight sequence by one token; return the ones that finished."""
        ...

    def num_in_flight(self) -> int:
        """Sequences added and not yet returned by `step()`."""
        ...

    def abort(self, request_id: str) -> None:
        """Drop an in-flight sequence (its tokens are discarded, it is never returned)."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights in place, keeping in-flight sequences and their KV cache.

        Names are the trainer's (transformers) parameter names. Tokens decoded from the next step
        on are attributed to `version`.
        """
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

    def step(self) -> dict[str, float]:
        """Clip (spec `training.gradientClipping`, 0 = off), apply the optimizer, zero the gradients,
        and bump `version`. Returns at least `grad_norm` (before clipping) and `lr`."""
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
