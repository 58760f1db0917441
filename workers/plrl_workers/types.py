"""Plain data that crosses module boundaries inside the runtime (no torch, no grpc).

Neighbours: `rpc/` converts these to and from protobuf; `engines/` produce `FinishedSequence`s;
`coordinator` leases `Prompt`s and receives `RolloutGroup`s; `rl/` trains on them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TypeVar

import numpy
import numpy.typing as npt

Int32s = npt.NDArray[numpy.int32]
Float32s = npt.NDArray[numpy.float32]
_Scalar = TypeVar("_Scalar", bound=numpy.generic)


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One task item. `prompt_id` is unique within a job and stable across restarts."""

    prompt_id: int
    text: str
    answer: str
    token_ids: tuple[int, ...]


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


@dataclasses.dataclass(init=False, eq=False)
class Sample:
    """One scored completion of a prompt.

    The per-token data are 1-D numpy arrays, the same dtypes as on the wire (`rpc/plrl.proto`), so a
    received sample is a zero-copy view of its message (`rpc/convert.py`), the checks are vectorised
    (`coordinator_checks.py`) and the trainer reads them without a Python loop per token. Sequences
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
    def oldest_version(self) -> int:
        return min((int(s.versions.min()) for s in self.samples if len(s.versions)), default=0)
