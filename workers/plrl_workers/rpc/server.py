"""The coordinator's gRPC server: each RPC is a few lines over `coordinator.Coordinator`.

`serve()` starts a server on `host:port` (0 = any free port) with the job-token interceptor
(`rpc/auth.py`). The servicer converts messages (`rpc/convert.py`), calls the coordinator, and maps
`protocol.Refused` to a gRPC status. Per-group refusals travel inside `SubmitAck`s, so a bad group
never ends a generator's rollout stream. The full-weights pull streams the latest
`weight_sync.snapshot.WeightSnapshot`.

Threads: every open call holds one server thread while it lasts (a Control or SubmitRollouts stream
for its whole life, a lease request while it waits), about 4 per generator; `rpc/limits.py` bounds
them in all and per peer, keeps threads free for `Status`, and closes connections whose peer stopped
answering, so `limits.max_workers` must exceed 4 x the number of generators plus a margin.

Usage (trainer rank 0):

    srv = server.serve(coord, token=token, snapshots=store, host="0.0.0.0", port=7000)
    ...
    srv.stop()
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
from collections.abc import Iterator
from typing import Any

import grpc

from plrl_workers import protocol
from plrl_workers.coordinator import core as coordinator
from plrl_workers.rpc import auth, convert, limits
from plrl_workers.rpc.generated import plrl_pb2 as pb
from plrl_workers.rpc.generated import plrl_pb2_grpc as pb_grpc
from plrl_workers.weight_sync import snapshot

log = logging.getLogger(__name__)

MAX_LEASE_WAIT_S = 30.0
MAX_PROMPTS_PER_LEASE = 4096
# How long `Server.stop` waits past its grace period for gRPC to confirm the calls ended.
STOP_WAIT_S = 5.0

_STATUS = {code: getattr(grpc.StatusCode, code.name) for code in protocol.Code}


def _abort(context: Any, coord: coordinator.Coordinator, exc: protocol.Refused) -> None:
    coord.count_refusal(exc.code.name)
    log.warning("refused %s from %s: %s", exc.code.name, context.peer(), exc)
    context.abort(_STATUS[exc.code], str(exc))


class CoordinatorService(pb_grpc.CoordinatorServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(
        self,
        coord: coordinator.Coordinator,
        snapshots: snapshot.SnapshotStore | None,
        chunk_bytes: int = snapshot.DEFAULT_CHUNK_BYTES,
    ) -> None:
        self._coord = coord
        self._snapshots = snapshots
        self._chunk_bytes = chunk_bytes

    def Register(self, request: Any, context: Any) -> Any:
        try:
            reg = self._coord.register(request.generator_id)
        except protocol.Refused as exc:
            _abort(context, self._coord, exc)
        return pb.RegisterReply(
            weight_version=reg.weight_version,
            samples_per_prompt=reg.samples_per_prompt,
            lease_timeout_s=reg.lease_timeout_s,
            session=reg.session,
            incarnation=reg.incarnation,
        )

    def LeasePrompts(self, request: Any, context: Any) -> Any:
        n = max(1, min(request.max_prompts, MAX_PROMPTS_PER_LEASE))
        wait_s = max(0.0, min(request.wait_s, MAX_LEASE_WAIT_S))
        try:
            batch = self._coord.lease(
                request.generator_id,
                n,
                wait_s,
                incarnation=request.incarnation,
                prompt_ids=list(request.prompt_ids[:n]),
            )
        except protocol.Refused as exc:
            _abort(context, self._coord, exc)
        now = self._coord.now()
        return pb.LeaseReply(
            leases=[convert.lease_to_pb(x, now) for x in batch.leases], finished=batch.finished
        )

    def SubmitRollouts(self, request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:
        for m in request_iterator:
            yield convert.ack_to_pb(self._submit_one(m))

    def _submit_one(self, m: Any) -> protocol.SubmitResult:
        try:
            group = convert.group_from_pb(m)  # zero-copy views of the message's packed arrays
        except ValueError as exc:
            return self._coord.refuse(m.lease_id, m.generator_id, protocol.Code.INVALID_ARGUMENT, str(exc))
        return self._coord.submit(group)

    def Control(self, request: Any, context: Any) -> Iterator[Any]:
        try:
            channel = self._coord.attach_control(request.generator_id, incarnation=request.incarnation)
        except protocol.Refused as exc:
            _abort(context, self._coord, exc)
        try:
            while context.is_active():
                try:
                    event = channel.get(timeout=0.5)
                except queue.Empty:
                    continue
                if event is None:  # replaced by a newer stream, or the generator was declared dead
                    return
                yield convert.control_to_pb(event)
                if isinstance(event, protocol.Stop):
                    return
        finally:
            self._coord.detach_control(request.generator_id, channel, incarnation=request.incarnation)

    def PullWeights(self, request: Any, context: Any) -> Iterator[Any]:
        snap = self._snapshots.latest() if self._snapshots is not None else None
        if snap is None or snap.version < request.min_version:
            have = "none" if snap is None else snap.version
            exc = protocol.Refused(
                protocol.Code.UNAVAILABLE,
                f"weights version >= {request.min_version} not available (have {have})",
            )
            _abort(context, self._coord, exc)
        assert snap is not None
        params = [convert.param_to_pb(p) for p in snap.params]
        first = True
        for data in snapshot.chunks(snap, self._chunk_bytes):
            if first:
                yield pb.WeightChunk(version=snap.version, params=params, data=data)
                first = False
            else:
                yield pb.WeightChunk(data=data)
        if first:  # no bytes at all (an empty model): still send the header
            yield pb.WeightChunk(version=snap.version, params=params)
        log.info("served weights v%d (%d B) to %s", snap.version, snap.total_bytes, request.generator_id)

    def Status(self, request: Any, context: Any) -> Any:
        return convert.stats_to_pb(self._coord.stats())


class Server:
    """A started coordinator server; `port` is the bound port."""

    def __init__(self, grpc_server: Any, port: int, limiter: limits.CallLimiter) -> None:
        self._server = grpc_server
        self.port = port
        self.limiter = limiter

    def stop(self, grace_s: float = 1.0) -> bool:
        """Stop serving: open calls get `grace_s` to finish, then are cancelled. Bounded: a handler
        thread that ignores cancellation (blocked in user code) cannot hold the caller; False then."""
        done: bool = self._server.stop(grace_s).wait(grace_s + STOP_WAIT_S)
        if not done:
            log.warning("coordinator server: calls still running %.0f s after stop", grace_s + STOP_WAIT_S)
        return done


def serve(
    coord: coordinator.Coordinator,
    *,
    token: str,
    snapshots: snapshot.SnapshotStore | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    call_limits: limits.CallLimits | None = None,
    tls: tuple[bytes, bytes] | None = None,
) -> Server:
    """Start serving `coord` on `host:port` (0 = a free port) and return at once; over TLS with
    `tls` = (private key, certificate chain), PEM (the job's, `names.TLS_SERVER_NAME`)."""
    bounds = call_limits or limits.CallLimits()
    options = [
        ("grpc.max_receive_message_length", protocol.MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", protocol.MAX_MESSAGE_BYTES),
        *bounds.server_options(),
    ]
    # The token first: an unauthenticated call is refused before it counts against any limit.
    token_check = auth.TokenInterceptor(
        token, on_refused=lambda _method: coord.count_refusal("UNAUTHENTICATED")
    )
    limiter = limits.CallLimiter(bounds, on_refused=lambda _method: coord.count_refusal("RESOURCE_EXHAUSTED"))
    srv = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=bounds.max_workers, thread_name_prefix="plrl-rpc"),
        interceptors=[token_check, limiter],
        options=options,
        maximum_concurrent_rpcs=bounds.max_queued,
    )
    pb_grpc.add_CoordinatorServicer_to_server(CoordinatorService(coord, snapshots), srv)
    address = f"{host}:{port}"
    bound = (
        srv.add_insecure_port(address)
        if tls is None
        else srv.add_secure_port(address, grpc.ssl_server_credentials([tls]))
    )
    if bound == 0:
        raise OSError(f"could not bind the coordinator server to {host}:{port}")
    srv.start()
    log.info("coordinator serving on %s:%d (%s)", host, bound, "TLS" if tls else "plain text")
    return Server(srv, bound, limiter)
