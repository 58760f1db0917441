"""Sequence packing: the step's sequences -> per-rank lists of fixed-capacity micro-batches.

A micro-batch is one row of at most `tokens_per_micro_batch` tokens holding whole sequences
(prompt + completion) back to back; a sequence is never split. `position_ids` restart at 0 for
each sequence, and that is what keeps sequences from attending to each other: transformers (5.x)
derives a block-diagonal causal mask from restarting position ids for the sdpa/eager/flex
attention paths, and cu_seqlens for flash-attention, *provided* no 2D attention mask and no KV
cache are passed. The forward must therefore use `use_cache=False` (`rl/step.py` does); with the
default `use_cache=True` on Qwen2 the packed sequences silently attend across each other
(measured: logits off by ~0.7). tests/workers/rl/test_packing.py checks loss and gradients of a packed
micro-batch against per-sequence computation for both sdpa and eager attention.

Per-token tensors are aligned to *targets*: index t describes the prediction made at input
position t of the token at t+1 (the next token of the same sequence). `loss_mask[t]` is true only
when that next token is a completion token, so prompt tokens and the last token of each sequence
(whose next token belongs to another sequence) carry no loss.

Data parallelism: `plan` splits the step's sequences across ranks (longest first, each to the rank
with the fewest tokens so far), packs each rank's share first-fit decreasing, and pads every rank to
the same number of micro-batches with a one-token empty micro-batch, because ZeRO-2 and DDP reduce
gradients in backward and need every rank to run the same number of backward passes.

Neighbours: `rl/step.py` (builds `TrainSequence`s from rollouts, runs the forward on a
`MicroBatch`), `rl/losses.py` (consumes the per-token tensors).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy
import numpy.typing as npt
import torch

Ints = Sequence[int] | npt.NDArray[numpy.integer[Any]]
Floats = Sequence[float] | npt.NDArray[numpy.floating[Any]]


@dataclasses.dataclass(frozen=True)
class TrainSequence:
    """One sample ready for training: the prompt, the completion and its per-token data."""

    prompt_ids: Ints
    completion_ids: Ints
    behaviour_logprobs: Floats
    """Log-probability of each completion token under the sampler's (temperature-scaled) policy."""
    versions: Ints
    """Weight version that produced each completion token."""
    advantage: float
    weight: float = 1.0
    """Loss weight of the whole sample (lag policy `downweight`); 1 otherwise."""

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.behaviour_logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"{n} completion tokens but {len(self.behaviour_logprobs)} logprobs and "
                f"{len(self.versions)} versions"
            )
        if len(self.prompt_ids) == 0:
            raise ValueError("a training sequence needs at least one prompt token")

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclasses.dataclass
class MicroBatch:
    """One packed row. Inputs are [1, T]; per-token data are [T], aligned to targets."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    """[1, T]: index of the sequence each token belongs to within this micro-batch."""
    target_ids: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    versions: torch.Tensor
    weights: torch.Tensor
    num_sequences: int
    batch_tokens: int
    """Loss tokens in the whole optimizer batch, on all ranks: the loss normaliser."""
    grad_scale: float
    """Multiplies the loss to undo the backend's mean over ranks (the data-parallel world size)."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to(self, device: torch.device | str) -> MicroBatch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)


def pack(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: bins of indices into `lengths` whose lengths sum to <= capacity.

    Deterministic (ties broken by index); indices inside a bin are in ascending order.
    """
    for i, n in enumerate(lengths):
        if n > capacity:
            raise ValueError(
                f"sequence {i} has {n} tokens (prompt + completion) but training.tokensPerMicroBatch="
                f"{capacity}; raise tokensPerMicroBatch or lower generation.maxNewTokens"
            )
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return [sorted(b) for b in bins]


def split_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Longest-first to the least-loaded rank (by tokens). Deterministic; every rank may be empty."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be at least 1")
    shares: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], len(shares[r]), r))
        shares[r].append(i)
        load[r] += lengths[i]
    return [sorted(s) for s in shares]


def collate(seqs: Sequence[TrainSequence], batch_tokens: int, grad_scale: float = 1.0) -> MicroBatch:
    """Lay `seqs` out back to back in one row (no padding); see the module docstring for alignment."""
    num_sequences = len(seqs)
    if not seqs:  # padding for a rank with less data: one token, no loss
        seqs = [TrainSequence([0], [], [], [], advantage=0.0, weight=0.0)]
    cols: dict[str, list[npt.NDArray[Any]]] = collections.defaultdict(list)
    for k, s in enumerate(seqs):
        ids = numpy.concatenate(
            [numpy.asarray(s.prompt_ids, numpy.int64), numpy.asarray(s.completion_ids, numpy.int64)]
        )
        n, p = len(ids), len(s.prompt_ids)
        # Position t predicts token t+1; completion token j sits at p+j, predicted at p+j-1.
        on = slice(p - 1, n - 1)
        cols["input_ids"].append(ids)
        cols["position_ids"].append(numpy.arange(n, dtype=numpy.int64))
        cols["segment_ids"].append(numpy.full(n, k, dtype=numpy.int64))
        cols["target_ids"].append(numpy.append(ids[1:], 0))
        cols["loss_mask"].append(_spread(True, on, n, numpy.bool_))
        cols["behaviour_logprobs"].append(_spread(s.behaviour_logprobs, on, n, numpy.float32))
        cols["advantages"].append(_spread(s.advantage, on, n, numpy.float32))
        cols["versions"].append(_spread(s.versions, on, n, numpy.int64))
        cols["weights"].append(_spread(s.weight, on, n, numpy.float32))
    t = {name: torch.from_numpy(numpy.concatenate(parts)) for name, parts in cols.items()}
    return MicroBatch(
        input_ids=t["input_ids"][None],
        position_ids=t["position_ids"][None],
        segment_ids=t["segment_ids"][None],
        target_ids=t["target_ids"],
        loss_mask=t["loss_mask"],
        behaviour_logprobs=t["behaviour_logprobs"],
        advantages=t["advantages"],
        versions=t["versions"],
        weights=t["weights"],
        num_sequences=num_sequences,
        batch_tokens=batch_tokens,
        grad_scale=grad_scale,
    )


def _spread(values: Any, on: slice, n: int, dtype: type[numpy.generic]) -> npt.NDArray[Any]:
    """Length-`n` zeros with `values` (a scalar or one per completion token) at the loss positions."""
    out = numpy.zeros(n, dtype=dtype)
    out[on] = values
    return out


def plan(seqs: Sequence[TrainSequence], world_size: int, capacity: int) -> list[list[MicroBatch]]:
    """Every rank's micro-batches for one optimizer step; all ranks get the same number.

    The normaliser `batch_tokens` is the number of completion tokens of all `seqs` (all ranks), so
    the gradient is independent of the split and of `world_size`.
    """
    lengths = [len(s) for s in seqs]
    batch_tokens = sum(len(s.completion_ids) for s in seqs)
    per_rank: list[list[MicroBatch]] = []
    for share in split_ranks(lengths, world_size):
        bins = pack([lengths[i] for i in share], capacity)
        per_rank.append([collate([seqs[share[j]] for j in b], batch_tokens, world_size) for b in bins])
    most = max(1, *(len(mbs) for mbs in per_rank))
    for mbs in per_rank:
        mbs.extend(collate([], batch_tokens, world_size) for _ in range(most - len(mbs)))
    return per_rank
