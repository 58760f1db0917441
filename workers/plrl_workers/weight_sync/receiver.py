"""Generator side of weight sync: join the trainer's broadcast group of one epoch and receive versions.

One `WeightReceiver` per group (epoch). The generator gets `(GroupInfo, Announcement)` pairs from
the coordinator's control stream (`rpc/client.py`); when the GroupInfo differs from the receiver's,
it closes the old receiver and makes a new one. If `receive()` fails midway (a peer died), the
engine holds a mix of two versions: pull the full weights (`CoordinatorClient.pull_weights`) before
decoding on. `receive()` yields every parameter once,
in announcement order, as soon as its bucket has landed (the next bucket is already on the wire), so
the engine can load weights while the rest is still arriving.

Usage (what the torch engine's `join_weight_group` / `receive_weights` do; the generator drives them
from its control stream, `generator.Generator._receive`):

    if rx is None or rx.group != event.group:   # a WeightUpdate of a new epoch, or a restarted trainer
        if rx is not None:
            rx.close()
        rx = receiver.WeightReceiver(event.group, device="cpu")
    try:
        engine.update_weights(rx.receive(event.announcement), event.announcement.version)
    except (groups.GroupAborted, RuntimeError):
        rx.close(); rx = None   # a new epoch will be announced; meanwhile pull the full weights

Neighbours: `sender.WeightBroadcaster` (rank 0), `groups.py` (handshake, process groups),
`buckets.py`/`packing.py` (layout), `weight_sync/vllm_extension.py` (runs this inside vLLM workers).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch
from torch._C import _distributed_c10d as c10d

from plrl_workers import protocol, stores
from plrl_workers.weight_sync import buckets, groups, packing, pool

log = logging.getLogger(__name__)


class WeightReceiver:
    """Rank `group.rank` of epoch `group.epoch`; receives on `device` ("cpu" for gloo, "cuda:N" for nccl).

    Construction only connects to the rendezvous store; the process group is built inside the first
    `receive()` (after the sender's go), so construction never blocks on other generators.
    """

    def __init__(
        self, group: protocol.GroupInfo, device: str, *, timeout_s: float = 120.0, reuse_buffers: bool = False
    ) -> None:
        self.group = group
        # Opt-in: receive each version into the previous version's buffers (warm memory, no page
        # faults); the tensors of a version are then valid only until the next receive() call.
        self._pool = pool.BufferPool() if reuse_buffers else None
        self._held: list[torch.Tensor] = []
        self._device = torch.device(device)
        self._timeout_s = timeout_s
        self._store = stores.tcp_store(group.host, group.port, is_master=False, timeout_s=timeout_s)
        self._estore = groups.epoch_store(self._store, group.epoch)
        self._pg: c10d.Backend | None = None
        self._closed = False

    def receive(self, ann: protocol.Announcement) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, tensor) for every parameter of `ann`, in order; tensors live on `device`.

        The tensors are views of bucket buffers: freshly allocated by default, so they stay valid
        as long as you hold them; with `reuse_buffers=True`, until the next `receive()` call.
        Must be iterated to the end (the collectives are matched with the sender's). Raises
        `groups.GroupAborted` if the sender aborted this version (a member was missing): close
        this receiver and wait for the next announcement.
        """
        if self._closed:
            raise RuntimeError("WeightReceiver used after close()")
        if ann.epoch != self.group.epoch:
            raise ValueError(
                f"announcement is for epoch {ann.epoch}; this receiver is in epoch {self.group.epoch}"
            )
        if self._pool is not None:
            self._pool.put(self._held)
            self._held = []
        vstore = groups.version_store(self._estore, ann.version)
        groups.announce_ready(vstore, self.group.rank)
        groups.wait_go(vstore, self._timeout_s)
        if self._pg is None:
            self._pg = groups.new_process_group(
                self._estore,
                rank=self.group.rank,
                world_size=self.group.world_size,
                backend=self.group.backend,
                timeout_s=self._timeout_s,
                gloo_host=groups.local_address_towards(self.group.host, self.group.port),
            )
        return self._receive(self._pg, ann)

    def _receive(self, pg: c10d.Backend, ann: protocol.Announcement) -> Iterator[tuple[str, torch.Tensor]]:
        layout = buckets.plan(ann.params, ann.bucket_bytes)
        posted: list[tuple[torch.Tensor, c10d.Work | None]] = []

        def post(i: int) -> None:
            if self._pool is None:
                buf = torch.empty(layout[i].nbytes, dtype=torch.uint8, device=self._device)
            else:
                buf = self._pool.get(layout[i].nbytes, self._device)
                self._held.append(buf)
            posted.append((buf, groups.broadcast_async(pg, buf) if layout[i].nbytes else None))

        if layout:
            post(0)
        for i, bucket in enumerate(layout):
            if i + 1 < len(layout):
                post(i + 1)  # keep the wire busy while the caller loads this bucket
            buf, work = posted[i]
            if work is not None:
                work.wait()
            posted[i] = (buf, None)  # drop our reference to the finished work
            yield from packing.unpack(bucket, ann.params, buf)

    def close(self) -> None:
        """Leave the group (idempotent); the receiver cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        groups.close_process_group(self._pg)
        self._pg = None
