"""Bounds on what open calls may hold on the coordinator's server, so that no client, however many
calls it opens or however long it keeps them, can starve the others.

Every open call holds one of the server's threads for as long as it lasts (a stream for its whole
life, a lease request while it waits), so without bounds a few hundred stalled streams take all of
them and `Status`, the generators and the trainer's own leases time out. `CallLimiter` admits a
call only while

- fewer than `max_calls` calls are open (the threads less a reserve of 1/32, at least 2: `Status`,
  which returns at once and is never counted, always finds a thread), and, for a streaming call,
  fewer than `max_streams` (3/4 of that: streams held open can never take the threads the
  generators' lease requests need), and
- its peer address has fewer than `max_calls_per_peer` open (None: no per-peer bound; `plrl run`'s
  processes all connect from 127.0.0.1, so an address cannot tell them apart there);

anything more is refused at once with RESOURCE_EXHAUSTED, naming the limit (a refusal takes a thread
for microseconds, so a new call waits behind refusals at most, never behind the stalled calls).
gRPC's own `maximum_concurrent_rpcs` bounds the calls it accepts at all, running and waiting for a
thread (`max_queued`, 4x the threads): beyond it gRPC refuses before any thread sees the call. A
peer that stops answering (a hung or partitioned process, a client that never reads) is found by
HTTP/2 keepalive pings: after `keepalive_s` of silence the server pings, and a connection whose ping
is not answered within `keepalive_timeout_s` is closed, ending its calls and freeing their threads.

Neighbours: `rpc/server.py` installs the limiter and the options; `rpc/client.py` pings likewise.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0
UNCOUNTED = frozenset({"/plrl.v1.Coordinator/Status"})
"""Methods that return at once and are never held open (not counted, never refused here)."""


@dataclasses.dataclass(frozen=True)
class CallLimits:
    """The coordinator server's bounds (see the module docstring)."""

    max_workers: int = 256
    """Server threads: every open call holds one."""
    max_calls_per_peer: int | None = 32
    """Open calls one peer address may hold (a generator holds about 4); None: unbounded."""
    keepalive_s: float = 20.0
    """Ping a connection after this long without a frame from it."""
    keepalive_timeout_s: float = 10.0
    """Close a connection whose ping is not answered within this long."""

    def __post_init__(self) -> None:
        if self.max_workers <= self.reserved_threads:
            raise ValueError(f"max_workers must exceed the {self.reserved_threads} reserved threads")
        if self.max_calls_per_peer is not None and self.max_calls_per_peer < 1:
            raise ValueError("max_calls_per_peer must be at least 1 (or None: unbounded)")

    @property
    def reserved_threads(self) -> int:
        """Threads no counted call may take: what `Status` and refusals run on."""
        return max(2, self.max_workers // 32)

    @property
    def max_calls(self) -> int:
        return self.max_workers - self.reserved_threads

    @property
    def max_queued(self) -> int:
        return 4 * self.max_workers

    @property
    def max_streams(self) -> int:
        return max(1, self.max_calls * 3 // 4)

    def server_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_time_ms", int(self.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            # A stalled stream sends no data: keep pinging it (gRPC stops after 2 pings otherwise),
            # and give up on an unanswered ping after the keepalive timeout (gRPC's own ping
            # timeout is a minute, and it is what closes the connection).
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.ping_timeout_ms", int(self.keepalive_timeout_s * 1000)),
            # Clients ping too (`client_options`): accept their pings at that pace, not gRPC's
            # default 5 min minimum, which would make the server close their connections.
            ("grpc.http2.min_ping_interval_without_data_ms", int(self.keepalive_s * 500)),
            ("grpc.http2.max_ping_strikes", 0),
        ]


CALLS_PER_GENERATOR = 4
"""What one generator holds open: its Control and SubmitRollouts streams, a lease request, a pull."""


def for_job(max_generators: int, bind_host: str) -> CallLimits:
    """The bounds for a job of at most `max_generators` generators served on `bind_host`: threads
    for all of them with room to spare (at least gRPC's usual 256), and no per-peer bound on a
    loopback address (every `plrl run` process connects from it)."""
    workers = max(256, 2 * CALLS_PER_GENERATOR * max_generators + 32)
    try:
        loopback = ipaddress.ip_address(bind_host).is_loopback
    except ValueError:  # a host name: a pod's, never plrl run's
        loopback = False
    per_peer = None if loopback else CallLimits.max_calls_per_peer
    return CallLimits(max_workers=workers, max_calls_per_peer=per_peer)


def client_options(
    keepalive_s: float = CallLimits.keepalive_s, timeout_s: float = 10.0
) -> list[tuple[str, int]]:
    """Keepalive for a client: a coordinator that vanished (a lost node sends no RST) is noticed
    after `keepalive_s + timeout_s`, not after the kernel's TCP timeout of many minutes."""
    return [
        ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.ping_timeout_ms", int(timeout_s * 1000)),
    ]


def peer_host(peer: str) -> str:
    """The address part of a gRPC peer string ('ipv4:10.0.0.7:51234' -> '10.0.0.7',
    'ipv6:[fd00::7]:51234' -> 'fd00::7'); anything else is its own key."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return peer


class CallLimiter(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped here
    """Counts open calls, in all and per peer address, and refuses those over `limits`.

    `on_refused(method)` is called for every refused call (metrics count them by reason)."""

    def __init__(self, limits: CallLimits, on_refused: Callable[[str], None] | None = None) -> None:
        self._limits = limits
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self._open = 0
        self._streams = 0
        self._by_peer: dict[str, int] = {}
        self._quiet_until = 0.0
        self._unsaid = 0

    def open_calls(self) -> int:
        with self._lock:
            return self._open

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or details.method in UNCOUNTED:
            return handler
        return _wrapped(handler, details.method, self)

    def _admit(self, method: str, context: Any, streaming: bool) -> str | None:
        """Count the call in; None if it is over a limit (then it was refused)."""
        host = peer_host(context.peer())
        with self._lock:
            per_peer = self._by_peer.get(host, 0)
            if self._open >= self._limits.max_calls:
                why = f"{self._open} calls are open, the most this coordinator serves at once"
            elif streaming and self._streams >= self._limits.max_streams:
                why = f"{self._streams} streams are open, the most this coordinator holds at once"
            elif self._limits.max_calls_per_peer is not None and per_peer >= self._limits.max_calls_per_peer:
                why = f"{per_peer} calls from {host} are open, the most one peer may hold"
            else:
                self._open += 1
                self._streams += streaming
                self._by_peer[host] = per_peer + 1
                return host
        self._say(f"refused {method} from {context.peer()}: {why}")
        if self._on_refused is not None:
            self._on_refused(method)
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
        return None  # not reached: abort raises

    def _say(self, message: str) -> None:
        """Log a refusal, at most once per LOG_EVERY_S (a flood of calls must not flood the log)."""
        now = time.monotonic()
        with self._lock:
            if now < self._quiet_until:
                self._unsaid += 1
                return
            unsaid, self._unsaid, self._quiet_until = self._unsaid, 0, now + LOG_EVERY_S
        more = f" ({unsaid} more refused since the last such warning)" if unsaid else ""
        log.warning("%s%s", message, more)

    def _release(self, host: str, streaming: bool) -> None:
        with self._lock:
            self._open -= 1
            self._streams -= streaming
            left = self._by_peer[host] - 1
            if left:
                self._by_peer[host] = left
            else:
                del self._by_peer[host]


def _wrapped(handler: Any, method: str, limiter: CallLimiter) -> Any:
    """`handler` with its call counted from admission until it returns (or its stream ends)."""
    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    request_streaming = bool(handler.request_streaming)  # stream_unary: held open like a stream

    def unary(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def call(request: Any, context: Any) -> Any:
            host = limiter._admit(method, context, streaming=request_streaming)
            assert host is not None
            try:
                return behavior(request, context)
            finally:
                limiter._release(host, streaming=request_streaming)

        return call

    def streaming(behavior: Callable[[Any, Any], Iterator[Any]]) -> Callable[[Any, Any], Iterator[Any]]:
        def call(request: Any, context: Any) -> Iterator[Any]:
            host = limiter._admit(method, context, streaming=True)
            assert host is not None
            try:
                yield from behavior(request, context)
            finally:
                limiter._release(host, streaming=True)

        return call

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), **kw)
    return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **kw)
