"""The coordinator over real gRPC on 127.0.0.1 (a free port), as a generator sees it.

Cases: a call without or with a wrong token is refused (UNAUTHENTICATED), logged and counted, on unary
and streaming RPCs; malformed rollout groups (bad lengths, NaN, unknown lease, undecodable bytes,
future versions) are each refused with their status inside one stream, which keeps going, and the
server keeps serving; lease -> submit -> take returns exactly what was sent; backpressure reaches the
generator as RESOURCE_EXHAUSTED, and `RolloutStream` re-sends until every group is in; the control
stream delivers weight announcements, pull hints and stop; the full-weights pull is bit-exact and
refuses versions it does not have; a generator replaced under its id is fenced out (no leases, no
control stream, its late rollouts refused); one that goes away has its prompts re-queued at once;
streams that end because the job stops re-queue nothing.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import torch

from plrl_workers import protocol
from plrl_workers.coordinator import core as coordinator
from plrl_workers.rpc import client, convert, limits, rollout_stream, server
from plrl_workers.rpc.generated import plrl_pb2 as pb
from plrl_workers.rpc.generated import plrl_pb2_grpc as pb_grpc
from plrl_workers.weight_sync import snapshot
from tests.polling import eventually

TOKEN = "s3cret-job-token"
G = 3


def prompts(n: int) -> Iterator[protocol.Prompt]:
    for i in range(n):
        yield protocol.Prompt(prompt_id=100 + i, text=f"{i}+1=?", answer=str(i + 1), token_ids=(7, 8, i))


@pytest.fixture
def coord() -> coordinator.Coordinator:
    return coordinator.Coordinator(
        prompts(20), coordinator.Config(samples_per_prompt=G, buffer_groups=4, submit_wait_s=0.2)
    )


@pytest.fixture
def store() -> snapshot.SnapshotStore:
    return snapshot.SnapshotStore()


@pytest.fixture
def srv(coord: coordinator.Coordinator, store: snapshot.SnapshotStore) -> Iterator[server.Server]:
    s = server.serve(
        coord,
        token=TOKEN,
        snapshots=store,
        host="127.0.0.1",
        port=0,
        call_limits=limits.CallLimits(max_workers=16),
    )
    yield s
    s.stop(0)


@pytest.fixture
def cli(srv: server.Server) -> Iterator[client.CoordinatorClient]:
    with client.CoordinatorClient(f"127.0.0.1:{srv.port}", TOKEN, timeout_s=10) as c:
        yield c


def group_for(lease: protocol.Lease, n: int = 5, version: int = 0) -> protocol.RolloutGroup:
    return protocol.RolloutGroup(
        lease_id=lease.lease_id,
        prompt_id=lease.prompt.prompt_id,
        prompt_token_ids=list(lease.prompt.token_ids),
        samples=[
            protocol.Sample(
                token_ids=[10 + j + i for j in range(n)],
                logprobs=[-0.1 * (j + 1) for j in range(n)],
                versions=[version] * n,
                reward=float(i),
                finish_reason="stop" if i else "length",
            )
            for i in range(G)
        ],
        generator_id=lease.generator_id,
    )


def test_calls_without_the_job_token_are_refused_and_logged(
    srv: server.Server, coord: coordinator.Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    target = f"127.0.0.1:{srv.port}"
    with client.CoordinatorClient(target, "wrong-token") as bad:
        with pytest.raises(grpc.RpcError) as err:
            bad.register("g")
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            list(bad.submit_rollouts([]))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(target) as channel:  # no metadata at all
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.CoordinatorStub(channel).Status(pb.StatusRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert coord.stats().refused == {"UNAUTHENTICATED": 3}
    messages = [r.getMessage() for r in caplog.records]
    assert sum("wrong job token" in m for m in messages) == 2
    assert sum("missing job token" in m for m in messages) == 1
    assert coord.stats().generators == 0  # nothing got through


def test_a_generator_started_before_the_coordinator_registers_once_it_listens(
    coord: coordinator.Coordinator, store: snapshot.SnapshotStore
) -> None:
    with socket.socket() as probe:  # a port nobody listens on yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result: list[protocol.Registration] = []
    with client.CoordinatorClient(f"127.0.0.1:{port}", TOKEN) as early:
        waiter = threading.Thread(target=lambda: result.append(early.register("gen-0", ready_timeout_s=30)))
        waiter.start()
        time.sleep(1.0)  # the generator is up first, as when trainer rank 0 is still loading the model
        assert waiter.is_alive() and not result
        s = server.serve(coord, token=TOKEN, snapshots=store, host="127.0.0.1", port=port)
        try:
            waiter.join(timeout=30)
        finally:
            s.stop(0)
    assert result and result[0].samples_per_prompt == G
    assert coord.stats().generators == 1


def test_lease_submit_take_round_trip(cli: client.CoordinatorClient, coord: coordinator.Coordinator) -> None:
    reg = cli.register("gen-0")
    assert (reg.samples_per_prompt, reg.weight_version) == (G, 0)
    batch = cli.lease_prompts("gen-0", 3, wait_s=1)
    assert [x.prompt.prompt_id for x in batch.leases] == [100, 101, 102]
    assert batch.leases[1].prompt == next(p for p in prompts(2) if p.prompt_id == 101)
    sent = [group_for(x) for x in batch.leases]
    assert all(r.ok for r in cli.submit(sent))
    taken = coord.take(3, timeout_s=5)
    assert [g.lease_id for g in taken] == [g.lease_id for g in sent]
    for got, want in zip(taken, sent, strict=True):
        assert got.prompt_token_ids == want.prompt_token_ids and got.generator_id == "gen-0"
        for gs, ws in zip(got.samples, want.samples, strict=True):
            # Bit-exact, and the same dtypes (int32 ids and versions, float32 logprobs) as sent.
            for field in ("token_ids", "logprobs", "versions"):
                got_a, want_a = getattr(gs, field), getattr(ws, field)
                assert got_a.dtype == want_a.dtype and got_a.tobytes() == want_a.tobytes(), field
            assert (gs.reward, gs.finish_reason) == (ws.reward, ws.finish_reason)
    coord.finish_step(1)
    status = cli.status()
    assert status.accounting.trained == 3 and status.accounting.balanced
    assert status.weight_version == 1


def test_malformed_rollouts_are_refused_one_by_one_and_the_server_keeps_serving(
    cli: client.CoordinatorClient, srv: server.Server, coord: coordinator.Coordinator
) -> None:
    cli.register("gen-0")
    leases = cli.lease_prompts("gen-0", 4).leases
    wrong_lengths = group_for(leases[0])
    wrong_lengths.samples[1].logprobs = wrong_lengths.samples[1].logprobs[:-1]
    nan = group_for(leases[0])
    nan.samples[2].logprobs[0] = math.nan
    future = group_for(leases[0], version=5)
    unknown = group_for(leases[0])
    unknown.lease_id = "no-such-lease"
    good = [group_for(x) for x in leases]
    results = cli.submit([wrong_lengths, nan, future, unknown, good[0], good[0], *good[1:]])
    assert [r.code for r in results] == [
        protocol.Code.INVALID_ARGUMENT,
        protocol.Code.INVALID_ARGUMENT,
        protocol.Code.FAILED_PRECONDITION,
        protocol.Code.NOT_FOUND,
        protocol.Code.OK,
        protocol.Code.ALREADY_EXISTS,
        protocol.Code.OK,
        protocol.Code.OK,
        protocol.Code.OK,
    ]
    assert "logprobs" in results[0].message
    # Bytes that are not whole int32s cannot even be decoded: refused the same way, stream goes on.
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        broken = convert.group_to_pb(group_for(leases[0]))
        broken.samples[0].token_ids = b"\x01\x02\x03"
        acks = list(
            stub.SubmitRollouts(iter([broken, broken]), metadata=(("authorization", f"Bearer {TOKEN}"),))
        )
    assert [a.code for a in acks] == [pb.INVALID_ARGUMENT, pb.INVALID_ARGUMENT]
    assert "int32" in acks[0].message
    assert cli.status().refused == {
        "INVALID_ARGUMENT": 4,
        "FAILED_PRECONDITION": 1,
        "NOT_FOUND": 1,
        "ALREADY_EXISTS": 1,
    }
    assert len(coord.take(4, timeout_s=5)) == 4


def test_a_full_buffer_reaches_the_generator_as_resource_exhausted(cli: client.CoordinatorClient) -> None:
    cli.register("gen-0")
    leases = cli.lease_prompts("gen-0", 5).leases
    results = cli.submit([group_for(x) for x in leases])
    assert [r.code for r in results] == [protocol.Code.OK] * 4 + [protocol.Code.RESOURCE_EXHAUSTED]


def test_unregistered_generators_cannot_lease(cli: client.CoordinatorClient) -> None:
    with pytest.raises(grpc.RpcError) as err:
        cli.lease_prompts("ghost", 1)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND  # register first


def test_control_stream_delivers_announcements_pulls_and_stop(
    cli: client.CoordinatorClient, coord: coordinator.Coordinator
) -> None:
    cli.register("gen-0")
    events: list[protocol.ControlEvent] = []
    stream = cli.control("gen-0")
    reader = threading.Thread(target=lambda: events.extend(stream))
    reader.start()
    for _ in range(200):  # the stream attaches when the server picks the call up
        if coord.weight_members() == ["gen-0"]:
            break
        threading.Event().wait(0.05)
    group = protocol.GroupInfo("127.0.0.1", 29500, 1, 3, 4, "gloo")
    ann = protocol.Announcement(
        2, 4, (protocol.ParamMeta("w", "bfloat16", (3, 2)), protocol.ParamMeta("b", "int64", ())), 1024
    )
    assert coord.announce_weights("gen-0", group, ann)
    assert coord.request_pull("gen-0", 2)
    coord.stop("finished")
    reader.join(timeout=10)
    assert events == [
        protocol.WeightUpdate(group, ann),
        protocol.PullWeights(2),
        protocol.Stop("finished"),
    ]


def test_a_closed_control_stream_tells_the_broadcaster_the_announced_member_is_gone(
    cli: client.CoordinatorClient, coord: coordinator.Coordinator
) -> None:
    """`weight_member_connected` (the broadcaster's probe) follows the stream that carried the
    announcement: it turns False once that stream ends (a killed generator), and stays False when
    the generator registers anew (its new process knows nothing of the announcement)."""
    cli.register("gen-0")
    stream = cli.control("gen-0")
    eventually(lambda: coord.weight_members() == ["gen-0"], what="the control stream attached")
    group = protocol.GroupInfo("127.0.0.1", 29500, 1, 2, 4, "gloo")
    ann = protocol.Announcement(2, 4, (protocol.ParamMeta("w", "float32", (3, 2)),), 1024)
    assert not coord.weight_member_connected("gen-0")  # nothing announced to it yet
    assert coord.announce_weights("gen-0", group, ann)
    assert coord.weight_member_connected("gen-0")
    stream.cancel()  # what the kernel does for a killed process: the connection goes away
    eventually(lambda: not coord.weight_member_connected("gen-0"), what="the closed stream noticed")
    cli.register("gen-0")
    again = cli.control("gen-0")
    eventually(lambda: coord.weight_members() == ["gen-0"], what="the new stream attached")
    assert not coord.weight_member_connected("gen-0")
    again.cancel()


def test_pull_weights_is_bit_exact_and_refuses_missing_versions(
    cli: client.CoordinatorClient, store: snapshot.SnapshotStore
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        cli.pull_weights("gen-0", 0)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    g = torch.Generator().manual_seed(1)
    weights = {
        "big": torch.randn(700, 1000, generator=g),  # several chunks
        "small": torch.randn(5, generator=g).to(torch.bfloat16),
        "count": torch.tensor(3),
    }
    store.publish(snapshot.WeightSnapshot.from_named_tensors(4, weights.items()))
    pulled = cli.pull_weights("gen-0", 3)
    assert pulled.version == 4
    got = dict(pulled.named_tensors)
    assert list(got) == list(weights)
    for name, t in weights.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)
    with pytest.raises(grpc.RpcError) as err:
        cli.pull_weights("gen-0", 5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_rollout_stream_resends_on_backpressure_until_every_group_is_in(
    cli: client.CoordinatorClient, coord: coordinator.Coordinator
) -> None:
    cli.register("gen-0")
    leases = cli.lease_prompts("gen-0", 8).leases
    outcomes: list[protocol.SubmitResult] = []
    stream = rollout_stream.RolloutStream(cli, on_result=outcomes.append, retry_delay_s=0.05)
    for lease in leases:
        stream.put(group_for(lease))
    stray = group_for(leases[0])
    stray.lease_id = "not-a-lease"
    stream.put(stray)
    taken: list[protocol.RolloutGroup] = []
    while len(taken) < 8:  # a slow trainer: the buffer (4 groups) fills and submits are refused for a while
        taken += coord.take(2, timeout_s=10)
        threading.Event().wait(0.3)
    stream.close(timeout_s=30)
    assert stream.error is None and stream.in_flight() == 0
    assert sorted(g.lease_id for g in taken) == sorted(x.lease_id for x in leases)
    assert sorted((r.lease_id, r.code) for r in outcomes) == sorted(
        [(x.lease_id, protocol.Code.OK) for x in leases] + [("not-a-lease", protocol.Code.NOT_FOUND)]
    )
    assert coord.stats().refused.get("RESOURCE_EXHAUSTED", 0) > 0  # backpressure did happen


def test_a_replaced_generator_is_fenced_out(srv: server.Server, coord: coordinator.Coordinator) -> None:
    """Two processes under one generator id (a hung pod that comes back after its replacement
    registered): the newer registration wins; the older one can lease nothing, its control stream
    ends, and its leases are back in the queue, so its late rollouts are refused."""
    target = f"127.0.0.1:{srv.port}"
    with client.CoordinatorClient(target, TOKEN) as old, client.CoordinatorClient(target, TOKEN) as new:
        first = old.register("gen-0")
        (lease,) = old.lease_prompts("gen-0", 1).leases
        stream = iter(old.control("gen-0"))
        eventually(lambda: coord.stats().control_streams == 1, what="the old process's control stream")
        second = new.register("gen-0")
        assert second.incarnation != first.incarnation
        with pytest.raises(StopIteration):
            next(stream)  # the old process's control stream is over
        with pytest.raises(grpc.RpcError) as refused:
            old.lease_prompts("gen-0", 1)
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "was replaced" in str(refused.value.details())
        with pytest.raises(grpc.RpcError) as refused:
            next(iter(old.control("gen-0")))
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        (late,) = old.submit([group_for(lease)])
        assert late.code is protocol.Code.FAILED_PRECONDITION and "re-queued" in late.message
        # The replacement gets the prompt the old one held.
        (again,) = new.lease_prompts("gen-0", 1).leases
        assert again.prompt.prompt_id == lease.prompt.prompt_id
        a = coord.stats().accounting
        assert (a.issued, a.leased, a.balanced) == (1, 1, True)


def test_a_generator_that_goes_away_has_its_prompts_requeued_at_once(
    srv: server.Server, coord: coordinator.Coordinator
) -> None:
    """The process dies (here: its channel closes): the coordinator sees its control stream end and
    re-queues its leases without waiting out `lease_timeout_s` (600 s here)."""
    target = f"127.0.0.1:{srv.port}"
    gone = client.CoordinatorClient(target, TOKEN)
    gone.register("gen-0")
    leased = gone.lease_prompts("gen-0", 3).leases
    stream = gone.control("gen-0")
    threading.Thread(target=lambda: list(_ignore_cancel(stream)), daemon=True).start()
    eventually(lambda: coord.stats().control_streams == 1, what="the control stream")
    assert coord.stats().accounting.leased == 3
    gone.close()
    eventually(lambda: coord.stats().accounting.requeued == 3, what="its leases re-queued")
    s = coord.stats()
    assert (s.accounting.requeued, s.accounting.leased, s.leases_revoked, s.generators) == (3, 0, 3, 0)
    with client.CoordinatorClient(target, TOKEN) as other:
        other.register("gen-1")
        got = other.lease_prompts("gen-1", 3).leases
    assert sorted(x.prompt.prompt_id for x in got) == sorted(x.prompt.prompt_id for x in leased)


def test_streams_that_end_while_the_job_stops_requeue_nothing(
    srv: server.Server, coord: coordinator.Coordinator
) -> None:
    target = f"127.0.0.1:{srv.port}"
    with client.CoordinatorClient(target, TOKEN) as c:
        c.register("gen-0")
        c.lease_prompts("gen-0", 2)
        stream = c.control("gen-0")
        threading.Timer(0.3, coord.stop, args=("job finished",)).start()
        events = list(stream)  # ends after the Stop
    assert isinstance(events[-1], protocol.Stop)
    s = coord.stats()
    assert (s.accounting.leased, s.leases_revoked) == (2, 0)


def _ignore_cancel(stream: client.ControlStream) -> Iterator[protocol.ControlEvent]:
    try:
        yield from stream
    except grpc.RpcError:
        return
