"""Weight broadcast with real gloo between real processes on 127.0.0.1.

The receivers are separate Python processes (`receiver_proc.py`) that get their announcements over a
pipe (the coordinator's control stream in production) and report a sha256 per received tensor.

Cases: two receivers get every tensor bit-exact, for two versions in one epoch, with several buckets
and a parameter larger than a bucket; replacing a receiver starts a new epoch that both members join;
a member that never shows up is dropped after the join timeout, reported as missed, and the others
still get the version (in a new epoch); the next version skips it without waiting; a member without
a control stream is left out at once, and so is one whose stream closes after the announcement (it
died), without waiting out the join timeout; a member that missed a version pulls it over gRPC
bit-exact.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import torch

from plrl_workers import protocol
from plrl_workers.coordinator import core as coordinator
from plrl_workers.rpc import limits, server
from plrl_workers.weight_sync import sender, snapshot

PROC = pathlib.Path(__file__).with_name("receiver_proc.py")
TIMEOUT_S = 120.0


class Peer:
    """A receiver process; `send` writes a command, `read` waits for its next JSON line."""

    def __init__(self, device: str = "cpu") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PROC), device], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def send(self, msg: dict[str, object]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout_s: float = TIMEOUT_S) -> dict[str, object]:
        try:
            result: dict[str, object] = json.loads(self._lines.get(timeout=timeout_s))
        except queue.Empty:
            raise AssertionError(f"receiver process said nothing for {timeout_s} s") from None
        return result

    def announce(self, member: str, group: protocol.GroupInfo, ann: protocol.Announcement) -> bool:
        self.send({"cmd": "update", "group": dataclasses.asdict(group), "ann": dataclasses.asdict(ann)})
        return True

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send({"cmd": "exit"})
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._pump_thread.join(timeout=10)  # EOF once the process is gone
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def start(n: int) -> list[Peer]:
    peers = [Peer() for _ in range(n)]  # they import torch in parallel
    for p in peers:
        assert p.read() == {"ready": True}
    return peers


@pytest.fixture(scope="module")
def peers() -> Iterator[dict[str, Peer]]:
    a, b = start(2)
    ps = {"a": a, "b": b}
    yield ps
    for p in ps.values():
        p.close()


def announce_to(peers: dict[str, Peer]) -> sender.Announce:
    def announce(member: str, group: protocol.GroupInfo, ann: protocol.Announcement) -> bool:
        return member in peers and peers[member].announce(member, group, ann)

    return announce


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {
        "embed.weight": torch.randn(300, 64, generator=g),  # 76 KB: larger than a bucket
        "layers.0.attn.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "layers.0.norm.weight": torch.randn(64, generator=g),
        "layers.0.mlp.weight": torch.randn(64, 32, generator=g).t(),  # not contiguous
        "step": torch.tensor(version),
        "empty": torch.empty(0, 3),
    }


def digests(named: dict[str, torch.Tensor]) -> dict[str, str]:
    return {
        n: hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        for n, t in named.items()
    }


def expect_exact(result: dict[str, object], version: int, named: dict[str, torch.Tensor]) -> None:
    assert result.get("version") == version and "aborted" not in result, result
    assert result["names"] == list(named)  # every parameter once, in announcement order
    assert result["digests"] == digests(named)


def test_two_receivers_get_every_tensor_bit_exact(peers: dict[str, Peer]) -> None:
    store = snapshot.SnapshotStore()
    bc = sender.WeightBroadcaster(advertise_host="127.0.0.1", bucket_bytes=16 << 10, snapshots=store)
    try:
        epochs = set()
        for version in (1, 2):
            named = weights(version)
            report = bc.broadcast(version, named.items(), ["a", "b"], announce_to(peers))
            assert (report.delivered, report.missed) == (("a", "b"), ())
            assert report.nbytes == sum(t.numel() * t.element_size() for t in named.values())
            epochs.add(report.epoch)
            for p in peers.values():
                expect_exact(p.read(), version, named)
        assert len(epochs) == 1  # same members: the group is reused
        latest = store.latest()
        assert latest is not None and latest.version == 2
        assert digests(dict(latest.named_tensors())) == digests(weights(2))
    finally:
        bc.close()


def test_replacing_a_receiver_starts_a_new_epoch(peers: dict[str, Peer]) -> None:
    bc = sender.WeightBroadcaster(advertise_host="127.0.0.1", bucket_bytes=16 << 10)
    try:
        first = bc.broadcast(1, weights(1).items(), ["a", "b"], announce_to(peers))
        for p in peers.values():
            expect_exact(p.read(), 1, weights(1))
        peers["b"].proc.kill()  # the generator pod dies; its replacement registers as "c"
        peers["b"].proc.wait()
        (peers["c"],) = start(1)
        second = bc.broadcast(2, weights(2).items(), ["a", "c"], announce_to(peers))
        assert second.epoch > first.epoch
        assert (second.delivered, second.missed) == (("a", "c"), ())
        expect_exact(peers["a"].read(), 2, weights(2))
        expect_exact(peers["c"].read(), 2, weights(2))
    finally:
        bc.close()


def test_a_member_that_never_joins_is_reported_and_the_rest_still_get_the_version(
    peers: dict[str, Peer],
) -> None:
    live = sorted(m for m, p in peers.items() if p.proc.poll() is None)
    assert len(live) == 2
    ghosts = {**peers, "ghost": peers[live[0]]}  # announced (to a process that ignores it), never joins
    announce = announce_to(ghosts)
    announced: list[tuple[str, int]] = []

    def ghost_aware(member: str, group: protocol.GroupInfo, ann: protocol.Announcement) -> bool:
        announced.append((member, ann.version))
        if member == "ghost":
            return True  # the announcement "went out" but nobody will answer it
        if member == "offline":
            return False  # no control stream: left out without waiting
        return announce(member, group, ann)

    bc = sender.WeightBroadcaster(advertise_host="127.0.0.1", join_timeout_s=3.0, skip_missing_for=1)
    try:
        report = bc.broadcast(5, weights(5).items(), [*live, "ghost"], ghost_aware)
        assert report.missed == ("ghost",) and report.delivered == tuple(live)
        for m in live:
            assert peers[m].read() == {"version": 5, "epoch": report.epoch - 1, "aborted": True}
            expect_exact(peers[m].read(), 5, weights(5))
        # Next version: the ghost is skipped (not even announced, so nobody waits for it to join; no
        # new epoch, so the others receive at once, with no aborted attempt), and reported again.
        again = bc.broadcast(6, weights(6).items(), [*live, "ghost"], ghost_aware)
        assert (again.missed, again.delivered, again.epoch) == (("ghost",), tuple(live), report.epoch)
        assert ("ghost", 5) in announced and ("ghost", 6) not in announced
        assert [m for m, v in announced if v == 6] == live
        for m in live:
            expect_exact(peers[m].read(), 6, weights(6))
        # A member with no control stream is left out at once (the others' epoch is aborted, not awaited).
        report = bc.broadcast(7, weights(7).items(), [*live, "offline"], ghost_aware)
        assert report.missed == ("offline",) and report.delivered == tuple(live)
        for m in live:
            assert peers[m].read()["aborted"] is True
            expect_exact(peers[m].read(), 7, weights(7))
    finally:
        bc.close()


def test_a_member_that_disconnects_before_joining_is_dropped_without_waiting_out_the_timeout(
    peers: dict[str, Peer],
) -> None:
    """The chaos soak's kill of a generator: announced to, then its process died (its control stream
    closed). With a join timeout far beyond this test's patience, the broadcast still completes for
    the others, because `connected` says the member cannot answer any more; and once it is back
    (registered anew) it is announced to again at the next version, not skipped."""
    live = sorted(m for m, p in peers.items() if p.proc.poll() is None)
    reborn: dict[str, Peer] = {}

    def dying(member: str, group: protocol.GroupInfo, ann: protocol.Announcement) -> bool:
        if member == "dead" and not reborn:
            return True  # the announcement went out; the process died before it could answer
        return announce_to({**peers, **reborn})(member, group, ann)

    bc = sender.WeightBroadcaster(advertise_host="127.0.0.1", join_timeout_s=600.0)
    out: list[sender.BroadcastReport] = []
    try:
        call = threading.Thread(
            target=lambda: out.append(
                bc.broadcast(5, weights(5).items(), [*live, "dead"], dying, lambda m: m != "dead")
            )
        )
        call.start()
        call.join(timeout=60)
        assert not call.is_alive(), "the broadcast waited for a member that was gone"
        (report,) = out
        assert report.missed == ("dead",) and report.delivered == tuple(live)
        for m in live:
            assert peers[m].read()["aborted"] is True
            expect_exact(peers[m].read(), 5, weights(5))
        (reborn["dead"],) = start(1)  # restarted, registered anew: connected again
        again = bc.broadcast(6, weights(6).items(), [*live, "dead"], dying, lambda m: True)
        assert (again.delivered, again.missed) == ((*live, "dead"), ())  # not skipped for having died
        for p in [*(peers[m] for m in live), reborn["dead"]]:
            expect_exact(p.read(), 6, weights(6))
    finally:
        bc.close()
        for p in reborn.values():
            p.close()


def test_a_member_that_missed_versions_pulls_them_over_grpc(peers: dict[str, Peer]) -> None:
    store = snapshot.SnapshotStore()
    bc = sender.WeightBroadcaster(advertise_host="127.0.0.1", snapshots=store)
    coord = coordinator.Coordinator(iter(()), coordinator.Config(samples_per_prompt=1))
    srv = server.serve(
        coord,
        token="tok",
        snapshots=store,
        host="127.0.0.1",
        port=0,
        call_limits=limits.CallLimits(max_workers=8),
    )
    try:
        report = bc.broadcast(9, weights(9).items(), [], announce_to(peers))  # nobody in the group
        assert report.delivered == () and report.missed == ()
        live = next(p for p in peers.values() if p.proc.poll() is None)
        live.send({"cmd": "pull", "target": f"127.0.0.1:{srv.port}", "token": "tok", "min_version": 9})
        expect_exact(live.read(), 9, weights(9))
    finally:
        srv.stop(0)
        bc.close()


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)
def test_nccl_broadcast_is_bit_exact() -> None:
    (peer,) = [Peer("cuda:1")]
    assert peer.read() == {"ready": True}
    torch.cuda.set_device(0)
    bc = sender.WeightBroadcaster(advertise_host="127.0.0.1", backend="nccl", device="cuda:0")
    try:
        for version in (1, 2):
            named = {n: t.cuda() for n, t in weights(version).items()}
            report = bc.broadcast(version, named.items(), ["g"], lambda m, g, a: peer.announce(m, g, a))
            assert report.delivered == ("g",)
            expect_exact(peer.read(), version, {n: t.cpu() for n, t in named.items()})
    finally:
        bc.close()
        peer.close()


def test_published_snapshots_stay_intact_while_held_though_buffers_are_recycled() -> None:
    store = snapshot.SnapshotStore()
    bc = sender.WeightBroadcaster(advertise_host="127.0.0.1", snapshots=store)
    try:
        bc.broadcast(1, weights(1).items(), [], lambda *_: False)
        held = store.latest()  # a pull in progress holds version 1
        for version in (2, 3, 4):  # version 2's buffers are recycled for 4, never version 1's
            bc.broadcast(version, weights(version).items(), [], lambda *_: False)
            latest = store.latest()
            assert latest is not None and digests(dict(latest.named_tensors())) == digests(weights(version))
        assert held is not None and digests(dict(held.named_tensors())) == digests(weights(1))
    finally:
        bc.close()
