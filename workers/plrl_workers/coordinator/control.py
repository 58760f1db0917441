"""Coordinator -> generator control events and the per-generator queues that carry them.

One channel per generator with an open Control stream (`rpc/server.py` drains it). The events are
plain data: a weight update to receive (`WeightUpdate`, sent by `weight_sync.sender` through
`Coordinator.announce_weights`), a hint to pull the full weights (`PullWeights`), and `Stop`. A
`None` on a channel means "this stream is over" (replaced by a newer stream, or the generator was
declared dead). Neighbours: `coordinator/core.py` (owns a `ControlHub`), `protocol.py` (the
events), `rpc/convert.py`.
"""

from __future__ import annotations

import queue
import threading

from plrl_workers import protocol

Channel = queue.SimpleQueue[protocol.ControlEvent | None]


class ControlHub:
    """Thread-safe map generator id -> channel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, Channel] = {}
        self._announced: dict[str, Channel] = {}  # where each generator's latest WeightUpdate went
        self._stopped: protocol.Stop | None = None

    def attach(self, generator_id: str) -> Channel:
        """A fresh channel for `generator_id`; an older one gets None (its stream ends)."""
        channel: Channel = queue.SimpleQueue()
        with self._lock:
            old = self._channels.get(generator_id)
            if old is not None:
                old.put(None)
            if self._stopped is not None:
                channel.put(self._stopped)
            self._channels[generator_id] = channel
        return channel

    def detach(self, generator_id: str, channel: Channel) -> bool:
        """Forget `channel` if it is still the generator's current one (a late detach is harmless);
        True if it was."""
        with self._lock:
            if self._channels.get(generator_id) is channel:
                del self._channels[generator_id]
                self._announced.pop(generator_id, None)
                return True
            return False

    def close(self, generator_id: str) -> None:
        with self._lock:
            channel = self._channels.pop(generator_id, None)
            self._announced.pop(generator_id, None)
        if channel is not None:
            channel.put(None)

    def members(self) -> list[str]:
        with self._lock:
            return list(self._channels)

    def send(self, generator_id: str, event: protocol.ControlEvent) -> bool:
        """Queue `event`; False if the generator has no open stream."""
        with self._lock:
            channel = self._channels.get(generator_id)
            if channel is not None and isinstance(event, protocol.WeightUpdate):
                self._announced[generator_id] = channel
        if channel is None:
            return False
        channel.put(event)
        return True

    def announced_stream_open(self, generator_id: str) -> bool:
        """Whether the stream that carried `generator_id`'s latest WeightUpdate is still its current
        one (False once it ended, or the generator registered anew and knows nothing of it)."""
        with self._lock:
            channel = self._channels.get(generator_id)
            return channel is not None and self._announced.get(generator_id) is channel

    def stop_all(self, reason: str) -> None:
        """Send Stop on every stream, now and on any opened later."""
        with self._lock:
            self._stopped = protocol.Stop(reason)
            for channel in self._channels.values():
                channel.put(self._stopped)
