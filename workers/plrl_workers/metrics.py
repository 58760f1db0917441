"""Prometheus metrics of a worker (generator or trainer), served at `http://host:port/metrics`.

Every name starts with `plrl_`. Each worker owns a private registry (several workers may share a
process in tests and in `plrl run`). Rates (tokens/s) are measured over a sliding window when
Prometheus scrapes; the `_total` counters are there for `rate()` in PromQL too. The coordinator's
numbers (queue and buffer depth, leases, prompt accounting, refused RPCs by reason) are read from
`Coordinator.stats()` at scrape time by `watch_coordinator`, so they are never stale.

Usage:

    m = metrics.WorkerMetrics(role="trainer")
    m.watch_coordinator(coord.stats)            # trainer rank 0 only
    endpoint = m.serve(port=0)                  # 0 = any free port; endpoint.port tells which
    m.add_trained_tokens(n); m.step_seconds.observe(dt); m.weight_version.set(step)
    m.observe_lag(mean, max_); m.reward.set(mean_reward)
    endpoint.close()

Neighbours: `coordinator/core.py` (stats), the trainer/generator main loops (the callers).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

import prometheus_client
from prometheus_client import core, registry

from plrl_workers import protocol


class RateMeter:
    """Events per second over the last `window_s` seconds (thread-safe)."""

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._events: collections.deque[tuple[float, float]] = collections.deque()
        self._start = clock()
        self._lock = threading.Lock()

    def add(self, amount: float) -> None:
        with self._lock:
            self._events.append((self._clock(), amount))

    def rate(self) -> float:
        with self._lock:
            total = self._in_window_locked()
            span = min(self._window_s, self._clock() - self._start)
            return total / span if span > 0 else 0.0

    def in_window(self) -> float:
        """The amounts added over the last `window_s` seconds."""
        with self._lock:
            return self._in_window_locked()

    def _in_window_locked(self) -> float:
        now = self._clock()
        while self._events and self._events[0][0] < now - self._window_s:
            self._events.popleft()
        return sum(a for _, a in self._events)


@dataclasses.dataclass
class Endpoint:
    """A running /metrics HTTP server."""

    port: int
    _server: object
    _thread: threading.Thread

    def close(self) -> None:
        server = self._server
        server.shutdown()  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]
        self._thread.join(timeout=5)


class WorkerMetrics:
    def __init__(self, role: str, window_s: float = 30.0) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        r = self.registry
        prometheus_client.Gauge("plrl_worker_info", "This worker's role.", ["role"], registry=r).labels(
            role
        ).set(1)
        self._generated = RateMeter(window_s)
        self._trained = RateMeter(window_s)
        self._decoding = RateMeter(window_s)  # seconds spent in engine steps
        self.generated_tokens = prometheus_client.Counter(
            "plrl_generated_tokens", "Tokens generated (completion tokens).", registry=r
        )
        self.trained_tokens = prometheus_client.Counter(
            "plrl_trained_tokens", "Tokens trained on (prompt + completion).", registry=r
        )
        prometheus_client.Gauge(
            "plrl_generated_tokens_per_second", "Generated tokens/s over the last window.", registry=r
        ).set_function(self._generated.rate)
        prometheus_client.Gauge(
            "plrl_trained_tokens_per_second", "Trained tokens/s over the last window.", registry=r
        ).set_function(self._trained.rate)
        self.weight_version = prometheus_client.Gauge(
            "plrl_weight_version",
            "Weight version this worker holds (trainer: last finished step).",
            registry=r,
        )
        self.lag = prometheus_client.Gauge(
            "plrl_lag_steps",
            "Per-token lag (trainer version - token version) of the last batch.",
            ["stat"],
            registry=r,
        )
        self.reward = prometheus_client.Gauge(
            "plrl_reward_mean", "Mean reward of the last batch.", registry=r
        )
        self.step_seconds = prometheus_client.Histogram(
            "plrl_step_seconds",
            "Wall time of one optimizer step (trainer) or one engine step (generator).",
            buckets=(0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100),
            registry=r,
        )
        self.in_flight = prometheus_client.Gauge(
            "plrl_sequences_in_flight", "Sequences a generator is decoding now.", registry=r
        )
        self.weight_sync_seconds = prometheus_client.Histogram(
            "plrl_weight_sync_seconds",
            "Time to send (trainer) or receive and load (generator) one weight version.",
            buckets=(0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30),
            registry=r,
        )

    def add_generated_tokens(self, n: int) -> None:
        self.generated_tokens.inc(n)
        self._generated.add(n)

    def add_trained_tokens(self, n: int) -> None:
        self.trained_tokens.inc(n)
        self._trained.add(n)

    def add_decoding_seconds(self, s: float) -> None:
        self._decoding.add(s)

    def generated_tokens_per_decoding_second(self) -> float:
        """Generated tokens per second spent decoding, over the last window: the generator's
        capacity, which waiting for leases (backpressure, an empty queue) does not dilute."""
        busy = self._decoding.in_window()
        return self._generated.in_window() / busy if busy > 0 else 0.0

    def generated_tokens_per_second(self) -> float:
        """Generated tokens/s over the last window (what the /metrics gauge shows)."""
        return self._generated.rate()

    def trained_tokens_per_second(self) -> float:
        """Trained tokens/s over the last window (what the /metrics gauge shows)."""
        return self._trained.rate()

    def observe_lag(self, mean: float, max_: float) -> None:
        self.lag.labels("mean").set(mean)
        self.lag.labels("max").set(max_)

    def watch_coordinator(self, stats: Callable[[], protocol.Stats]) -> None:
        """Export the coordinator's queue, buffer, lease, accounting and refusal numbers."""
        self.registry.register(_CoordinatorCollector(stats))

    def serve(self, port: int, host: str = "0.0.0.0") -> Endpoint:
        server, thread = prometheus_client.start_http_server(port, addr=host, registry=self.registry)
        return Endpoint(port=int(server.server_port), _server=server, _thread=thread)


class _CoordinatorCollector(registry.Collector):
    def __init__(self, stats: Callable[[], protocol.Stats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[core.Metric]:
        s = self._stats()
        a = s.accounting
        yield core.GaugeMetricFamily(
            "plrl_prompt_queue_depth", "Prompts re-queued and waiting for a generator.", value=a.requeued
        )
        yield core.GaugeMetricFamily(
            "plrl_rollout_buffer_groups", "Rollout groups buffered for the trainer.", value=a.buffered
        )
        yield core.GaugeMetricFamily(
            "plrl_rollout_buffer_capacity", "Capacity of the rollout buffer, groups.", value=s.buffer_capacity
        )
        yield core.GaugeMetricFamily(
            "plrl_leases_outstanding", "Prompts leased to generators now.", value=a.leased
        )
        yield core.GaugeMetricFamily("plrl_generators", "Registered generators.", value=s.generators)
        prompts = core.GaugeMetricFamily(
            "plrl_prompts",
            "Prompt accounting: issued = trained + dropped_by_lag + the rest.",
            labels=["state"],
        )
        for state, value in a.model_dump().items():
            prompts.add_metric([state], value)
        yield prompts
        leases = core.CounterMetricFamily(
            "plrl_leases_requeued", "Leases re-queued, by cause.", labels=["cause"]
        )
        leases.add_metric(["expired"], s.leases_expired)
        leases.add_metric(["revoked"], s.leases_revoked)
        leases.add_metric(["migrated"], s.leases_migrated)  # from slow generators to their peers
        yield leases
        yield core.CounterMetricFamily(
            "plrl_leases_adopted",
            "Re-queued prompts whose groups a reconnecting generator had finished (not decoded again).",
            value=s.leases_adopted,
        )
        refused = core.CounterMetricFamily(
            "plrl_rpc_refused", "Refused RPCs and rollout groups.", labels=["reason"]
        )
        for reason, count in sorted(s.refused.items()):
            refused.add_metric([reason], count)
        yield refused
