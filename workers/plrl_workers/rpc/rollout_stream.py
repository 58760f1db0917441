"""A generator's long-lived rollout stream: put groups in, get final outcomes out, backpressure handled.

One `SubmitRollouts` stream fed from a queue. A group the coordinator refuses with
RESOURCE_EXHAUSTED (its buffer stayed full; the lease was renewed) is sent again after
`retry_delay_s`; every other outcome (OK, or a refusal such as FAILED_PRECONDITION for a lease that
was re-queued meanwhile) is final and goes to `on_result`. Neighbours: `rpc/client.py` (the RPC),
the generator main loop (the caller).

Usage:

    stream = rollout_stream.RolloutStream(coord_client, on_result=lambda r: log_if_refused(r))
    stream.put(group)            # never blocks; gRPC flow control paces the sending thread
    ...
    stream.close()               # waits until every group has its final outcome
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator

from plrl_workers import protocol
from plrl_workers.rpc import client

log = logging.getLogger(__name__)

_END = None


class RolloutStream:
    def __init__(
        self,
        coord: client.CoordinatorClient,
        on_result: Callable[[protocol.SubmitResult], None] | None = None,
        retry_delay_s: float = 1.0,
    ) -> None:
        self._outbox: queue.SimpleQueue[protocol.RolloutGroup | None] = queue.SimpleQueue()
        self._pending: dict[str, protocol.RolloutGroup] = {}
        self._lock = threading.Condition()
        self._on_result = on_result
        self._retry_delay_s = retry_delay_s
        self._closing = False
        self.error: BaseException | None = None
        """Set if the stream broke (e.g. the coordinator went away); `put` then raises it."""
        self._acks = coord.submit_rollouts(self._requests())
        self._reader = threading.Thread(target=self._read, name="plrl-rollout-acks", daemon=True)
        self._reader.start()

    def put(self, group: protocol.RolloutGroup) -> None:
        with self._lock:
            if self.error is not None:
                raise RuntimeError("rollout stream is broken") from self.error
            if self._closing:
                raise RuntimeError("rollout stream is closed")
            self._pending[group.lease_id] = group
        self._outbox.put(group)

    def in_flight(self) -> int:
        """Groups put and not yet finally answered."""
        with self._lock:
            return len(self._pending)

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for every pending group's final outcome, then end the stream."""
        with self._lock:
            self._closing = True
            self._lock.wait_for(lambda: not self._pending or self.error is not None, timeout_s)
        self._outbox.put(_END)
        self._reader.join(timeout=timeout_s)

    def _requests(self) -> Iterator[protocol.RolloutGroup]:
        while True:
            group = self._outbox.get()
            if group is _END:
                return
            yield group

    def _read(self) -> None:
        try:
            for result in self._acks:
                self._handle(result)
        except Exception as exc:  # grpc.RpcError and friends: the stream is over
            log.error("rollout stream broke: %s", exc)
            with self._lock:
                self.error = exc
                self._lock.notify_all()

    def _handle(self, result: protocol.SubmitResult) -> None:
        if result.code is protocol.Code.RESOURCE_EXHAUSTED:
            with self._lock:
                group = self._pending.get(result.lease_id)
            if group is not None:
                timer = threading.Timer(self._retry_delay_s, self._outbox.put, args=(group,))
                timer.daemon = True
                timer.start()
            return
        with self._lock:
            self._pending.pop(result.lease_id, None)
            self._lock.notify_all()
        if self._on_result is not None:
            self._on_result(result)
