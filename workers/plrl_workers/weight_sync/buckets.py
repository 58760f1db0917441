"""The byte layout of a broadcast: which parameter goes into which bucket at which offset (pure, no torch).

Sender (`sender.py`) and receivers (`receiver.py`) both call `plan(params, bucket_bytes)` on the
same `Announcement`, so the layout never travels on the wire. Parameters keep their order; a bucket
is filled until the next parameter would overflow it; a parameter larger than `bucket_bytes` gets a
bucket of its own (parameters are never split, so a receiver can hand each one over as soon as its
bucket lands). Offsets are aligned to `ALIGN` bytes so a slice of a uint8 buffer can be viewed as
any dtype without a copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from plrl_workers import protocol

ALIGN = 64


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where parameter `index` (its position in the announcement) lives inside its bucket."""

    index: int
    offset: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One broadcast call: `nbytes` bytes holding `slots` back to back (with alignment padding)."""

    nbytes: int
    slots: tuple[Slot, ...]


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan(params: Sequence[protocol.ParamMeta], bucket_bytes: int) -> list[Bucket]:
    """Split `params` (in order) into buckets of at most `bucket_bytes` (except oversize parameters).

    >>> p = [protocol.ParamMeta("a", "float32", (10,)), protocol.ParamMeta("b", "float32", (10,))]
    >>> [len(b.slots) for b in plan(p, 128)]
    [2]
    >>> [len(b.slots) for b in plan(p, 64)]
    [1, 1]
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    used = 0  # end of the last slot in the open bucket
    for index, meta in enumerate(params):
        offset = _align(used)
        if slots and offset + meta.nbytes > bucket_bytes:
            buckets.append(Bucket(nbytes=used, slots=tuple(slots)))
            slots, offset = [], 0
        slots.append(Slot(index=index, offset=offset, nbytes=meta.nbytes))
        used = offset + meta.nbytes
    if slots:
        buckets.append(Bucket(nbytes=used, slots=tuple(slots)))
    return buckets
