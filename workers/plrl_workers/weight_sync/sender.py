"""Trainer rank 0: broadcast every parameter of a new version to all generators, bucketed, in-flight.

The broadcaster hosts the rendezvous `TCPStore` and owns one stateless process group per *epoch*
(`groups.py`). An epoch is a fixed membership; when the member list passed to `broadcast()` differs
from the current epoch's (a generator added, removed or replaced), the broadcast starts a new epoch.
Every version goes through a tiny handshake in the store (`groups.py`), so a member that is gone is
detected without hanging gloo: the version is aborted for everyone, the missing member is dropped,
and the version is re-announced to the rest in a new epoch within the same call.

Neighbours: the coordinator's control stream delivers the `(GroupInfo, Announcement)` pairs
(`announce` callback); `receiver.WeightReceiver` is the other end; `snapshot.SnapshotStore` receives
the packed buffers so a generator that missed versions can pull them over gRPC.

Usage (trainer rank 0, after each optimizer step):

    bc = sender.WeightBroadcaster(advertise_host="trainer-0.job", snapshots=store)
    report = bc.broadcast(
        version, model.named_parameters(), coord.weight_members(), coord.announce_weights,
        coord.weight_member_connected,
    )
    for gen in report.missed:       # did not get this version: tell them to pull it
        coord.request_pull(gen, version)
    ...
    bc.close()
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import torch
from torch._C import _distributed_c10d as c10d

from plrl_workers import protocol, stores
from plrl_workers.weight_sync import buckets, groups, packing, pool, snapshot

log = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 16 << 20  # small enough to overlap packing with sending (bench/weight_broadcast.py)
MAX_IN_FLIGHT = 2  # buckets on the wire while the next one is packed

# Deliver one member's announcement; False if that member cannot be reached (it is then left out).
Announce = Callable[[str, protocol.GroupInfo, protocol.Announcement], bool]
# Whether the member that was last announced to can still answer (False: it died or re-registered).
Connected = Callable[[str], bool]


@dataclasses.dataclass(frozen=True)
class BroadcastReport:
    """What one `broadcast()` achieved. `missed` members did not get `version` and should pull it."""

    version: int
    epoch: int
    delivered: tuple[str, ...]
    missed: tuple[str, ...]
    nbytes: int
    seconds: float


class WeightBroadcaster:
    """Sender side of weight sync: rendezvous store, per-epoch group, bucketed broadcast from rank 0.

    Args:
        advertise_host: address generators use to reach this process (store and gloo pairs).
        port: rendezvous store port (0 picks a free one; see `.port`).
        backend: "gloo" (CPU tensors) or "nccl" (CUDA tensors).
        device: where buckets are packed ("cpu" for gloo, the trainer's CUDA device for nccl).
        bucket_bytes: bytes per broadcast call (parameters are never split across buckets).
        timeout_s: collective timeout; a peer that dies mid-transfer fails the version after this.
        join_timeout_s: how long each version waits for every member's ready key (a member that
            is seen to be gone, see `broadcast(connected=)`, is not waited for).
        abort: if given and set (the trainer is stopping), a version stops waiting for members at once.
        bind_host: the address the rendezvous store listens on (None: every interface).
        snapshots: if given, every version is published there (CPU copy) for the pull path.
        skip_missing_for: a member that failed to join is left out of this many following
            broadcasts (reported in `missed` each time, so it can pull), so one broken generator
            does not cost every version a join timeout.
    """

    def __init__(
        self,
        *,
        advertise_host: str,
        port: int = 0,
        backend: str = "gloo",
        device: str = "cpu",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = 120.0,
        join_timeout_s: float = 30.0,
        skip_missing_for: int = 10,
        snapshots: snapshot.SnapshotStore | None = None,
        abort: threading.Event | None = None,
        bind_host: str | None = None,
    ) -> None:
        if backend not in protocol.BACKENDS:
            raise ValueError(f"backend must be one of {protocol.BACKENDS}, got {backend!r}")
        self._host = advertise_host
        self._backend = backend
        self._device = torch.device(device)
        self._bucket_bytes = bucket_bytes
        self._timeout_s = timeout_s
        self._join_timeout_s = join_timeout_s
        self._snapshots = snapshots
        self._abort = abort
        self._store = stores.tcp_store(
            advertise_host, port, is_master=True, timeout_s=timeout_s, bind_host=bind_host
        )
        # Epoch numbers grow from the wall clock, so a restarted trainer never reuses one that
        # generators still hold a group for.
        self._epoch = time.time_ns() // 1_000_000
        self._members: tuple[str, ...] = ()
        self._pg: c10d.Backend | None = None
        self._stale_keys: list[tuple[c10d.Store, list[str]]] = []
        self._skip_missing_for = skip_missing_for
        self._calls = 0
        self._skip_until: dict[str, int] = {}  # member -> first call that may include it again
        self._pool = pool.BufferPool()

    @property
    def port(self) -> int:
        return int(self._store.port)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def members(self) -> tuple[str, ...]:
        """Members of the current epoch, in rank order (rank = index + 1)."""
        return self._members

    def group_info(self, member: str) -> protocol.GroupInfo:
        rank = self._members.index(member) + 1
        return protocol.GroupInfo(
            host=self._host,
            port=self.port,
            rank=rank,
            world_size=len(self._members) + 1,
            epoch=self._epoch,
            backend=self._backend,
        )

    def broadcast(
        self,
        version: int,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        members: Sequence[str],
        announce: Announce,
        connected: Connected | None = None,
    ) -> BroadcastReport:
        """Send every tensor to every member (blocking); with no members only publish the snapshot.

        The tensors must not change until this returns (they are copied bucket by bucket while
        earlier buckets are on the wire). With `connected`, a member that has not joined yet and is
        no longer connected is dropped at once instead of after the join timeout.
        """
        start = time.perf_counter()
        self._drop_stale_keys()  # every receiver has read the previous call's go keys by now
        names: list[str] = []
        tensors: list[torch.Tensor] = []
        for name, tensor in named_tensors:
            names.append(name)
            tensors.append(tensor)
        params = tuple(packing.meta_of(n, t) for n, t in zip(names, tensors, strict=True))
        layout = buckets.plan(params, self._bucket_bytes)
        self._calls += 1
        wanted = tuple(m for m in dict.fromkeys(members) if self._skip_until.get(m, 0) <= self._calls)
        missed: list[str] = [m for m in dict.fromkeys(members) if m not in wanted]
        delivered: tuple[str, ...] = ()
        bufs: list[torch.Tensor] | None = None
        if wanted != self._members or (wanted and self._pg is None):
            self._new_epoch(wanted)
        while self._members:
            ann = protocol.Announcement(version, self._epoch, params, self._bucket_bytes)
            missing = self._handshake(ann, announce, connected)
            if missing:
                missed.extend(missing)
                for m in missing:
                    # One that is gone comes back with a new stream, ready; one that timed out may not.
                    if connected is None or connected(m):
                        self._skip_until[m] = self._calls + self._skip_missing_for + 1
                log.warning(
                    "weight v%d: %s missing from epoch %d; retrying without", version, missing, ann.epoch
                )
                self._new_epoch(tuple(m for m in self._members if m not in missing))
                continue
            try:
                if self._pg is None:
                    self._pg = groups.new_process_group(
                        groups.epoch_store(self._store, self._epoch),
                        rank=0,
                        world_size=len(self._members) + 1,
                        backend=self._backend,
                        timeout_s=self._timeout_s,
                        gloo_host=self._host,
                    )
                bufs = self._send(self._pg, layout, params, tensors)
                delivered = self._members
            except RuntimeError as exc:  # a peer died mid-transfer; the group is unusable now
                log.error("weight v%d: broadcast in epoch %d failed: %s", version, self._epoch, exc)
                missed.extend(self._members)
                self._new_epoch(())
            break
        if bufs is None:
            bufs = [self._pack(b, params, tensors) for b in layout]
        self._publish(version, params, layout, bufs)
        return BroadcastReport(
            version=version,
            epoch=self._epoch,
            delivered=delivered,
            missed=tuple(dict.fromkeys(missed)),
            nbytes=sum(p.nbytes for p in params),
            seconds=time.perf_counter() - start,
        )

    def close(self) -> None:
        groups.close_process_group(self._pg)
        self._pg = None
        self._members = ()

    def _new_epoch(self, members: tuple[str, ...]) -> None:
        groups.close_process_group(self._pg)
        self._pg = None
        self._epoch += 1
        self._members = members
        if members:
            log.info("weight sync epoch %d: members %s", self._epoch, list(members))

    def _handshake(
        self, ann: protocol.Announcement, announce: Announce, connected: Connected | None
    ) -> list[str]:
        """Announce `ann`, wait for every member's ready key, then say go or abort. Returns the missing."""
        unreachable = [m for m in self._members if not announce(m, self.group_info(m), ann)]
        vstore = groups.version_store(groups.epoch_store(self._store, ann.epoch), ann.version)
        ranks = [i + 1 for i, m in enumerate(self._members)]
        self._stale_keys.append((vstore, ["go", *(f"ready/{r}" for r in ranks)]))
        if unreachable:  # no point waiting: this epoch cannot complete
            vstore.set("go", groups.GO_ABORT)
            return unreachable
        members = self._members
        gone = None if connected is None else (lambda r: not connected(members[r - 1]))
        ready = groups.collect_ready(vstore, ranks, self._join_timeout_s, abort=self._abort, gone=gone)
        missing = [self._members[r - 1] for r in ready]
        vstore.set("go", groups.GO_ABORT if missing else groups.GO_OK)
        return missing

    def _send(
        self,
        pg: c10d.Backend,
        layout: list[buckets.Bucket],
        params: tuple[protocol.ParamMeta, ...],
        tensors: list[torch.Tensor],
    ) -> list[torch.Tensor]:
        bufs: list[torch.Tensor] = []
        in_flight: deque[c10d.Work] = deque()
        for bucket in layout:
            buf = self._pack(bucket, params, tensors)
            bufs.append(buf)
            if bucket.nbytes:
                in_flight.append(groups.broadcast_async(pg, buf))
            while len(in_flight) > MAX_IN_FLIGHT:
                in_flight.popleft().wait()
        while in_flight:
            in_flight.popleft().wait()
        return bufs

    def _pack(
        self, bucket: buckets.Bucket, params: tuple[protocol.ParamMeta, ...], tensors: list[torch.Tensor]
    ) -> torch.Tensor:
        out = self._pool.get(bucket.nbytes, self._device)
        return packing.pack(bucket, params, tensors, self._device, out=out)

    def _publish(
        self,
        version: int,
        params: tuple[protocol.ParamMeta, ...],
        layout: list[buckets.Bucket],
        bufs: list[torch.Tensor],
    ) -> None:
        """Hand this version to the snapshot store (its buffers come back when it is dropped)."""
        if self._snapshots is None:
            self._pool.put(bufs)
            return
        if self._device.type == "cpu":
            kept = bufs
        else:
            kept = [self._pool.get(b.numel(), torch.device("cpu")) for b in bufs]
            for dst, src in zip(kept, bufs, strict=True):
                dst.copy_(src)
            self._pool.put(bufs)
        snap = snapshot.WeightSnapshot(version, params, tuple(layout), tuple(kept))
        self._pool.put_when_gone(snap, kept)
        self._snapshots.publish(snap)

    def _drop_stale_keys(self) -> None:
        for store, keys in self._stale_keys:
            for key in keys:
                store.delete_key(key)
        self._stale_keys.clear()
