"""Stateless broadcast groups: one c10d process group per epoch over a prefix of the trainer's store.

A group is built directly from `ProcessGroupGloo`/`ProcessGroupNCCL` (not `init_process_group`), so
it lives beside the trainers' own default process group. Each epoch has its own key prefix in the
trainer's `TCPStore`. Every version goes through a small handshake before any collective (and before
the first one builds the process group), so the sender can tell who is missing instead of every
rank hanging inside gloo:

    receiver rank r:  set  epoch<e>/v<version>/ready/<r>;  wait  .../go  ("ok": receive, "abort": give up)
    sender (rank 0):  wait for every ready/<r> (timeout);  set go = "ok" or "abort"

Neighbours: `sender.py` (rank 0) and `receiver.py` (ranks 1..n).
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

GO_OK = "ok"
GO_ABORT = "abort"
SWEEP_S = 0.25  # how often a join that is still waiting looks for members that are gone


class GroupAborted(RuntimeError):
    """The sender gave up on this epoch (a member never showed up); wait for the next announcement."""


def epoch_store(store: c10d.Store, epoch: int) -> c10d.PrefixStore:
    return c10d.PrefixStore(f"plrl/weights/epoch{epoch}/", store)


def version_store(estore: c10d.Store, version: int) -> c10d.PrefixStore:
    return c10d.PrefixStore(f"v{version}/", estore)


def local_address_towards(host: str, port: int) -> str:
    """The local IP this machine uses to reach `host:port` (no packet is sent: UDP connect only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))
            addr = s.getsockname()[0]
        except OSError:
            return "127.0.0.1"
    return str(addr)


def new_process_group(
    store: c10d.Store,
    *,
    rank: int,
    world_size: int,
    backend: str,
    timeout_s: float,
    gloo_host: str,
) -> c10d.Backend:
    """Build the c10d backend for one epoch; blocks until all `world_size` ranks have called it."""
    timeout = datetime.timedelta(seconds=timeout_s)
    pg_store = c10d.PrefixStore("pg/", store)
    # The stubs lack the options overloads of these constructors; the runtime has them.
    ctor: Any
    if backend == "gloo":
        ctor = dist.ProcessGroupGloo
        opts = ctor._Options()
        opts._timeout = timeout
        opts._devices = [ctor.create_device(hostname=gloo_host)]
    elif backend == "nccl":
        ctor = dist.ProcessGroupNCCL
        opts = ctor.Options()
        opts._timeout = timeout
    else:
        raise ValueError(f"unknown weight-sync backend {backend!r}")
    pg = ctor(pg_store, rank, world_size, opts)
    assert isinstance(pg, c10d.Backend)
    return pg


def close_process_group(pg: c10d.Backend | None) -> None:
    if pg is None:
        return
    with contextlib.suppress(RuntimeError):  # already broken by a failed peer; nothing left to release
        pg.shutdown()


def broadcast_async(pg: c10d.Backend, buf: torch.Tensor) -> c10d.Work:
    """Broadcast `buf` from rank 0 (in place on the other ranks); wait on the returned work."""
    opts = c10d.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    work = cast(Any, pg).broadcast([buf], opts)  # Backend.broadcast is missing from the stubs
    assert isinstance(work, c10d.Work)
    return work


def announce_ready(store: c10d.Store, rank: int) -> None:
    store.set(f"ready/{rank}", "1")


def wait_go(store: c10d.Store, timeout_s: float) -> None:
    """Receiver side: block until the sender decides; raise GroupAborted on "abort"."""
    store.wait(["go"], datetime.timedelta(seconds=timeout_s))
    if store.get("go") != GO_OK.encode():
        raise GroupAborted("the sender aborted this weight-sync epoch")


def collect_ready(
    store: c10d.Store,
    ranks: Sequence[int],
    timeout_s: float,
    abort: threading.Event | None = None,
    gone: Callable[[int], bool] | None = None,
) -> list[int]:
    """Sender side: wait up to `timeout_s` for every rank's ready key; return the ranks missing.

    It polls the keys (`check` does not block) so that it can stop early: as soon as `gone(rank)` says a
    rank that has not answered never will (its process died or registered anew: the epoch cannot
    complete, so only those ranks are returned and the rest meet again in the next epoch), and at
    once when `abort` is set (a stopping trainer must not wait out the timeout for generators
    already gone). Without this a killed generator cost every peer, and the trainer, the whole timeout.
    """
    waiting = list(ranks)
    if not waiting:
        return []
    end = time.monotonic() + timeout_s
    pause, next_sweep = 0.001, 0.0
    while True:
        if store.check([f"ready/{r}" for r in waiting]):  # one request, however many are left
            return []
        now = time.monotonic()
        final = now >= end or (abort is not None and abort.is_set())
        if final or now >= next_sweep:
            # Who exactly is missing costs a request per rank, so it is asked at most every SWEEP_S
            # (a thousand generators must not cost a thousand requests per poll).
            waiting = [r for r in waiting if not store.check([f"ready/{r}"])]
            next_sweep = now + SWEEP_S
            if not waiting:
                return []
            lost = [r for r in waiting if gone is not None and gone(r)]
            if lost:
                return lost
            if final:
                return waiting
        time.sleep(pause)
        pause = min(pause * 2, 0.02)  # answers come within milliseconds, stragglers are polled gently
