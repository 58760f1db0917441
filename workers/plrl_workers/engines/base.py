"""The contract every generation engine meets (`torch` and `vllm`), tested by the same suite.

The generator role (`plrl_workers.generator`) drives an engine one `step()` at a time and applies
weight updates between steps, so an update never interrupts a decode step and in-flight sequences
keep their KV cache. Neighbours: `engines/torch_engine.py`, `engines/vllm_engine.py`,
`weight_sync/` (where update tensors come from).
"""

from __future__ import annotations

from collections.abc import Iterable
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
