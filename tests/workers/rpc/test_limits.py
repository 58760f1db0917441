"""The coordinator server under a client that opens too many calls or stops answering (issue 11,
finding 3), over real gRPC on loopback.

Cases: calls beyond the server's bound are refused at once with RESOURCE_EXHAUSTED while `Status`
still answers and a well-behaved generator still leases and submits; a peer address holding its
per-peer share is refused while another address is served; the limits free up when the calls end;
a client process that stops (SIGSTOP) with streams open has its connection closed by keepalive,
which frees every call it held; per-job bounds and peer-address parsing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import grpc
import pytest

from plrl_workers import protocol
from plrl_workers.coordinator import core as coordinator
from plrl_workers.rpc import auth, client, limits, server
from plrl_workers.rpc.generated import plrl_pb2 as pb
from plrl_workers.rpc.generated import plrl_pb2_grpc as pb_grpc
from tests.polling import eventually

TOKEN = "s3cret-job-token"


def _prompts(n: int) -> Iterator[protocol.Prompt]:
    for i in range(n):
        yield protocol.Prompt(prompt_id=i, text=f"{i}+1=?", answer=str(i + 1), token_ids=(7, 8, i))


@pytest.fixture
def coord() -> coordinator.Coordinator:
    return coordinator.Coordinator(_prompts(50), coordinator.Config(samples_per_prompt=1, buffer_groups=8))


def _serve(
    coord: coordinator.Coordinator, bounds: limits.CallLimits, host: str = "127.0.0.1"
) -> server.Server:
    return server.serve(coord, token=TOKEN, host=host, port=0, call_limits=bounds)


class Stalled:
    """`n` SubmitRollouts streams that never send anything, held open until `release()`."""

    def __init__(self, target: str, n: int) -> None:
        self._channel = grpc.insecure_channel(target)
        stub = pb_grpc.CoordinatorStub(self._channel)
        self._gate = threading.Event()
        self.calls = [stub.SubmitRollouts(self._never(), metadata=auth.metadata(TOKEN)) for _ in range(n)]

    def _never(self) -> Iterator[pb.RolloutGroup]:
        self._gate.wait()
        return
        yield  # a generator function that yields nothing

    def refused(self) -> int:
        """How many of the streams the server ended with RESOURCE_EXHAUSTED (ends them all)."""
        n = 0
        for call in self.calls:
            try:
                for _ in call:
                    pass
            except grpc.RpcError as err:
                n += err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        return n

    def release(self) -> None:
        self._gate.set()
        self._channel.close()


def test_streams_over_the_bound_are_refused_and_status_and_a_generator_are_still_served(
    coord: coordinator.Coordinator,
) -> None:
    bounds = limits.CallLimits(max_workers=24, max_calls_per_peer=None)
    srv = _serve(coord, bounds)
    target = f"127.0.0.1:{srv.port}"
    stalled = Stalled(target, 60)
    try:
        eventually(lambda: srv.limiter.open_calls() == bounds.max_streams, what="the streams' share full")
        with client.CoordinatorClient(target, TOKEN, timeout_s=10) as c:
            assert c.status().generators == 0  # Status runs on a reserved thread
            # Held streams cannot take the threads of lease requests: a generator still registers
            # and leases. A new stream is refused at once, saying why, not queued behind the others.
            c.register("gen-0")
            (lease,) = c.lease_prompts("gen-0", 1).leases
            assert lease.prompt.prompt_id == 0
            with pytest.raises(grpc.RpcError) as refused:
                list(c.submit_rollouts(iter(())))
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "streams are open" in str(refused.value.details())
            assert coord.stats().refused.get("RESOURCE_EXHAUSTED", 0) >= 1
            stalled.release()
            eventually(lambda: srv.limiter.open_calls() == 0, what="the stalled calls ended")
            assert list(c.submit_rollouts(iter(()))) == []  # served again
    finally:
        stalled.release()
        srv.stop(0)
    assert stalled.refused() == 60 - bounds.max_streams


def test_one_peer_address_holds_at_most_its_share(coord: coordinator.Coordinator) -> None:
    bounds = limits.CallLimits(max_workers=64, max_calls_per_peer=5)
    srv = _serve(coord, bounds, host="[::]")  # dual-stack: 127.0.0.1 and ::1 are two peers
    stalled = Stalled(f"127.0.0.1:{srv.port}", 8)
    try:
        eventually(lambda: srv.limiter.open_calls() == 5, what="the peer at its share")
        with client.CoordinatorClient(f"[::1]:{srv.port}", TOKEN, timeout_s=10) as other:
            other.register("gen-1")
            assert len(other.lease_prompts("gen-1", 2).leases) == 2
        gate = stalled.calls  # the three over the share were ended by the server
        assert sum(1 for call in gate if call.done()) == 3
    finally:
        stalled.release()
        srv.stop(0)
    assert stalled.refused() >= 3


_STALLING_CLIENT = """
import sys, threading, grpc
from plrl_workers.rpc import auth
from plrl_workers.rpc.generated import plrl_pb2_grpc as pb_grpc
gate = threading.Event()
def never():
    gate.wait()
    yield from ()
stub = pb_grpc.CoordinatorStub(grpc.insecure_channel(sys.argv[1]))
calls = [stub.SubmitRollouts(never(), metadata=auth.metadata(sys.argv[2])) for _ in range(int(sys.argv[3]))]
print("open", flush=True)
gate.wait()
"""


def test_a_client_that_stops_answering_has_its_calls_closed_by_keepalive(
    coord: coordinator.Coordinator,
) -> None:
    bounds = limits.CallLimits(
        max_workers=32, max_calls_per_peer=None, keepalive_s=1.0, keepalive_timeout_s=1.0
    )
    srv = _serve(coord, bounds)
    proc = subprocess.Popen(
        [sys.executable, "-c", _STALLING_CLIENT, f"127.0.0.1:{srv.port}", TOKEN, "10"],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
        eventually(lambda: srv.limiter.open_calls() == 10, what="the client's streams open")
        proc.send_signal(signal.SIGSTOP)  # alive to the kernel, silent to HTTP/2 pings
        eventually(lambda: srv.limiter.open_calls() == 0, timeout_s=60, what="keepalive closing them")
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        srv.stop(0)


def test_per_job_bounds_fit_every_generator_and_skip_per_peer_on_loopback() -> None:
    small = limits.for_job(4, "0.0.0.0")
    assert (small.max_workers, small.max_calls_per_peer) == (256, limits.CallLimits.max_calls_per_peer)
    big = limits.for_job(1000, "10.0.0.7")
    assert big.max_calls >= limits.CALLS_PER_GENERATOR * 1000
    assert limits.for_job(4, "127.0.0.1").max_calls_per_peer is None
    assert (
        limits.for_job(4, "pod-0.workers.ns.svc").max_calls_per_peer == limits.CallLimits.max_calls_per_peer
    )
    with pytest.raises(ValueError, match="reserved"):
        limits.CallLimits(max_workers=2)


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.0.0.7:51234", "10.0.0.7"),
        ("ipv6:[fd00::7]:51234", "fd00::7"),
        ("ipv6:[::ffff:127.0.0.1]:80", "::ffff:127.0.0.1"),
        ("unix:/tmp/sock", "unix:/tmp/sock"),
    ],
)
def test_peer_host(peer: str, host: str) -> None:
    assert limits.peer_host(peer) == host
