"""The full-weights pull path: the trainer keeps an immutable CPU copy of the latest weights and
streams it in chunks; a generator that missed versions reassembles it into named tensors.

Neighbours: `sender.WeightBroadcaster` publishes a `WeightSnapshot` into a `SnapshotStore` after
packing each version (its bucket buffers are the snapshot, so this costs no extra copy on CPU);
`rpc/server.py` serves `SnapshotStore.latest()` as the `PullWeights` stream using `chunks()`;
`rpc/client.py` turns that stream back into tensors with `assemble()`.

Usage (trainer, before the first broadcast, so new generators can pull version 0):

    store = snapshot.SnapshotStore()
    store.publish(snapshot.WeightSnapshot.from_named_tensors(0, model.named_parameters()))
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Iterator, Sequence

import numpy
import torch

from plrl_workers import protocol
from plrl_workers.weight_sync import buckets, packing

DEFAULT_CHUNK_BYTES = 2 << 20


@dataclasses.dataclass(frozen=True)
class WeightSnapshot:
    """Version `version` of every parameter, stored as CPU uint8 bucket buffers (`buckets.plan` layout).

    Never mutated after creation, so a pull that started on it may finish while newer versions are
    published.
    """

    version: int
    params: tuple[protocol.ParamMeta, ...]
    layout: tuple[buckets.Bucket, ...]
    buffers: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        if len(self.layout) != len(self.buffers):
            raise ValueError(f"snapshot has {len(self.layout)} buckets but {len(self.buffers)} buffers")

    @classmethod
    def from_named_tensors(
        cls, version: int, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 256 << 20
    ) -> WeightSnapshot:
        """Copy `named` (any device) into a new CPU snapshot."""
        names, tensors = _split(named)
        params = tuple(packing.meta_of(n, t) for n, t in zip(names, tensors, strict=True))
        layout = tuple(buckets.plan(params, bucket_bytes))
        buffers = tuple(packing.pack(b, params, tensors, "cpu") for b in layout)
        return cls(version=version, params=params, layout=layout, buffers=buffers)

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Views of every parameter, in order: read-only, and valid only while you hold the snapshot
        (the broadcaster reuses its buffers once the snapshot is dropped)."""
        for bucket, buf in zip(self.layout, self.buffers, strict=True):
            yield from packing.unpack(bucket, self.params, buf)


def _split(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[str], list[torch.Tensor]]:
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    for name, tensor in named:
        names.append(name)
        tensors.append(tensor)
    return names, tensors


class SnapshotStore:
    """Thread-safe holder of the latest `WeightSnapshot` (older ones are dropped once unreferenced)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: WeightSnapshot | None = None

    def publish(self, snap: WeightSnapshot) -> None:
        with self._lock:
            if self._latest is not None and snap.version < self._latest.version:
                raise ValueError(f"snapshot version {snap.version} is older than {self._latest.version}")
            self._latest = snap

    def latest(self) -> WeightSnapshot | None:
        with self._lock:
            return self._latest


def chunks(snap: WeightSnapshot, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """The parameters' raw bytes, concatenated in order without padding, cut into `chunk_bytes` pieces."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    pending = bytearray()
    for bucket, buf in zip(snap.layout, snap.buffers, strict=True):
        raw = buf.numpy()
        for slot in bucket.slots:
            view = memoryview(raw[slot.offset : slot.offset + slot.nbytes].data)
            while len(view):
                if not pending and len(view) >= chunk_bytes:
                    yield bytes(view[:chunk_bytes])
                    view = view[chunk_bytes:]
                    continue
                take = min(len(view), chunk_bytes - len(pending))
                pending += view[:take]
                view = view[take:]
                if len(pending) == chunk_bytes:
                    yield bytes(pending)
                    pending = bytearray()
    if pending:
        yield bytes(pending)


def assemble(
    params: Sequence[protocol.ParamMeta], data: Iterable[bytes], device: torch.device | str = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Rebuild each parameter from the `chunks()` stream, yielding it as soon as its bytes are in.

    Raises ValueError if the stream holds fewer or more bytes than `params` need.
    """
    it = iter(data)
    piece = memoryview(b"")
    for meta in params:
        out = torch.empty(meta.nbytes, dtype=torch.uint8)
        dst = out.numpy()
        filled = 0
        while filled < meta.nbytes:
            if not len(piece):
                nxt = next(it, None)
                if nxt is None:
                    raise ValueError(f"weight stream ended inside {meta.name} ({filled}/{meta.nbytes} B)")
                piece = memoryview(nxt)
                continue
            take = min(len(piece), meta.nbytes - filled)
            dst[filled : filled + take] = numpy.frombuffer(piece[:take], dtype=numpy.uint8)
            filled += take
            piece = piece[take:]
        yield meta.name, packing.typed_view(out, 0, meta).to(device)
    extra = len(piece) + sum(len(b) for b in it)
    if extra:
        raise ValueError(f"weight stream has {extra} bytes beyond the announced parameters")
