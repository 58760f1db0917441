"""The coordinator's wire types: everything that crosses the RPC between generators and trainer rank 0.

Plain data, no torch, no grpc. The coordinator (`coordinator/`) produces and consumes them, the
generator and the rollout stream send and receive them, and `rpc/convert.py` is the only code
that maps them to and from protobuf (`rpc/plrl.proto`).

- prompts and rollouts: `Prompt` (leased), `Sample` and `RolloutGroup` (returned);
- the lease protocol: `Registration`, `Lease`, `LeaseBatch`, `SubmitResult` with its `Code`,
  `Refused` for a call refused as a whole, `Stats` for the Status RPC;
- control events on a generator's control stream: `WeightUpdate`, `PullWeights`, `Stop`;
- weight-sync metadata: `ParamMeta`, `GroupInfo`, `Announcement` (tensors go over
  torch.distributed, the description of them over gRPC).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import TypeVar

import numpy
import numpy.typing as npt

from plrl_api import records

Int32s = npt.NDArray[numpy.int32]
Float32s = npt.NDArray[numpy.float32]
_Scalar = TypeVar("_Scalar", bound=numpy.generic)

MAX_MESSAGE_BYTES = 256 << 20
"""Largest gRPC message either side sends or accepts (a full weight pull is chunked below it)."""


# --------------------------------------------------------------------------- prompts and rollouts


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One task item. `prompt_id` is unique within a job and stable across restarts."""

    prompt_id: int
    text: str
    answer: str
    token_ids: tuple[int, ...]


@dataclasses.dataclass(init=False, eq=False)
class Sample:
    """One scored completion of a prompt.

    The per-token data are 1-D numpy arrays, the same dtypes as on the wire (`rpc/plrl.proto`), so a
    received sample is a zero-copy view of its message (`rpc/convert.py`), the checks are vectorised
    (`coordinator/checks.py`) and the trainer reads them without a Python loop per token. Sequences
    (an engine's lists) are converted once here; arrays of the right dtype are kept as they are.
    Equality is identity (arrays have no single truth value).
    """

    token_ids: Int32s
    logprobs: Float32s
    """Behaviour-policy logprob of each token."""
    versions: Int32s
    """Weight version that produced each token."""
    reward: float
    finish_reason: str

    def __init__(
        self,
        token_ids: npt.ArrayLike,
        logprobs: npt.ArrayLike,
        versions: npt.ArrayLike,
        reward: float,
        finish_reason: str,
    ) -> None:
        self.token_ids = _vector(token_ids, numpy.int32, "token_ids")
        self.logprobs = _vector(logprobs, numpy.float32, "logprobs")
        self.versions = _vector(versions, numpy.int32, "versions")
        self.reward = reward
        self.finish_reason = finish_reason


def _vector(values: npt.ArrayLike, dtype: type[_Scalar], what: str) -> npt.NDArray[_Scalar]:
    array: npt.NDArray[_Scalar] = numpy.asarray(values, dtype=dtype)
    if array.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D sequence, got shape {array.shape}")
    return array


@dataclasses.dataclass
class RolloutGroup:
    """All G samples of one leased prompt, sent back together (they share a baseline)."""

    lease_id: str
    prompt_id: int
    prompt_token_ids: list[int]
    samples: list[Sample]
    generator_id: str

    @property
    def num_tokens(self) -> int:
        return sum(len(self.prompt_token_ids) + len(s.token_ids) for s in self.samples)

    @property
    def nbytes(self) -> int:
        """Its token data as on the wire: what it costs the rollout buffer."""
        per_sample = sum(s.token_ids.nbytes + s.logprobs.nbytes + s.versions.nbytes for s in self.samples)
        return 4 * len(self.prompt_token_ids) + per_sample

    @property
    def oldest_version(self) -> int:
        return min((int(s.versions.min()) for s in self.samples if len(s.versions)), default=0)


# --------------------------------------------------------------------------- the lease protocol


class Code(enum.IntEnum):
    """Outcome of a coordinator call; numbers are gRPC's (`google.rpc.Code`), names too."""

    OK = 0
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    UNAVAILABLE = 14


@dataclasses.dataclass
class Lease:
    lease_id: str
    prompt: Prompt
    generator_id: str
    deadline: float
    """Clock time after which the lease is re-queued (see `Config.lease_timeout_s`)."""


@dataclasses.dataclass(frozen=True)
class LeaseBatch:
    leases: list[Lease]
    finished: bool
    """Nothing will ever be leased again (source exhausted and nothing out, or the job stops)."""


@dataclasses.dataclass(frozen=True)
class SubmitResult:
    lease_id: str
    code: Code
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


@dataclasses.dataclass(frozen=True)
class Registration:
    weight_version: int
    samples_per_prompt: int
    lease_timeout_s: float
    session: str
    incarnation: str = ""
    """This registration's fencing token: lease requests and the control stream carry it."""


@dataclasses.dataclass(frozen=True)
class Stats:
    accounting: records.PromptCounts
    weight_version: int
    buffer_capacity: int
    generators: int
    control_streams: int
    leases_expired: int
    leases_revoked: int
    refused: dict[str, int]
    source_exhausted: bool
    finished: bool
    """Source exhausted and every issued prompt trained or dropped."""
    leases_migrated: int = 0
    """Leases moved from slow generators to their peers (`Coordinator.migrate_from_slow`)."""
    session: str = ""
    """The coordinator's, as in `Registration.session`: a restarted trainer rank 0 has a new one."""
    leases_adopted: int = 0
    """Re-queued prompts leased to a generator that had already finished their groups for the
    previous coordinator (`Coordinator.lease(prompt_ids=...)`): delivered, not decoded again."""


@dataclasses.dataclass(frozen=True)
class Migration:
    """Part of a slow generator's work moved to its peers."""

    generator_id: str
    prompts: int
    rate: float
    """Its groups accepted per second over the window."""
    peers_median: float


class Refused(Exception):
    """A call the coordinator refuses as a whole (the RPC layer turns `code` into the gRPC status)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- control events


@dataclasses.dataclass(frozen=True)
class WeightUpdate:
    """Join `group` (a GroupInfo unlike your receiver's means a new group), then receive `announcement`."""

    group: GroupInfo
    announcement: Announcement


@dataclasses.dataclass(frozen=True)
class PullWeights:
    """You missed versions: pull the full weights (at least `version`) over gRPC."""

    version: int


@dataclasses.dataclass(frozen=True)
class Stop:
    reason: str


@dataclasses.dataclass(frozen=True)
class Revoke:
    """These leases were taken back (migrated to peers): stop decoding them. Their results would be
    refused anyway; this only frees the slots they hold."""

    lease_ids: tuple[str, ...]
    reason: str


ControlEvent = WeightUpdate | PullWeights | Stop | Revoke

# --------------------------------------------------------------------------- weight-sync metadata

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
