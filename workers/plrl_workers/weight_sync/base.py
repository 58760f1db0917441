"""Plain data shared by both ends of a weight sync (no torch): parameter metadata, group info, announcements.

The trainer's `weight_sync/sender.py` (`WeightBroadcaster`) produces an `Announcement` per version and
a `GroupInfo` per generator; they travel over the coordinator's gRPC control stream
(`rpc/convert.py`); the generator's `weight_sync/receiver.py` (`WeightReceiver`) consumes them.
`weight_sync/buckets.py` turns an announcement into the byte layout both ends agree on.
"""

from __future__ import annotations

import dataclasses
import math

# Bytes per element of every dtype we move; names are torch's (`str(torch.float32)` minus "torch.").
ITEMSIZE: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

BACKENDS = ("gloo", "nccl")


@dataclasses.dataclass(frozen=True)
class ParamMeta:
    """One tensor of the model: its (trainer-side, transformers) name, dtype name and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.dtype not in ITEMSIZE:
            raise ValueError(
                f"param {self.name}: unsupported dtype {self.dtype!r} (known: {sorted(ITEMSIZE)})"
            )
        if any(d < 0 for d in self.shape):
            raise ValueError(f"param {self.name}: negative dimension in shape {self.shape}")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """Where and as whom one generator joins the broadcast group of one epoch.

    `host:port` is the trainer's rendezvous store; rank 0 is always the trainer (the sender).
    """

    host: str
    port: int
    rank: int
    world_size: int
    epoch: int
    backend: str  # "gloo" | "nccl"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"group backend must be one of {BACKENDS}, got {self.backend!r}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"group rank {self.rank} outside world of size {self.world_size}")


@dataclasses.dataclass(frozen=True)
class Announcement:
    """What is about to be broadcast: every parameter of version `version`, in this order.

    `bucket_bytes` fixes the bucket layout (`buckets.plan`), so sender and receivers agree on it
    without sending offsets.
    """

    version: int
    epoch: int
    params: tuple[ParamMeta, ...]
    bucket_bytes: int

    def __post_init__(self) -> None:
        if self.bucket_bytes <= 0:
            raise ValueError(f"announcement bucket_bytes must be positive, got {self.bucket_bytes}")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError("announcement lists a parameter name twice")

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)
