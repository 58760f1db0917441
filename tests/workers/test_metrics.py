"""A worker's /metrics endpoint, scraped over HTTP the way Prometheus does.

Cases: every metric is named plrl_*; counters, rates, lag, reward, step time and the coordinator's
live numbers (queue, buffer, leases, prompt accounting, refusals by reason) show the values the
worker produced; the rate meter forgets events older than its window.
"""

from __future__ import annotations

import urllib.request

from prometheus_client import parser

from plrl_workers import metrics, protocol
from plrl_workers.coordinator import core as coordinator


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_endpoint_serves_worker_and_coordinator_numbers() -> None:
    source = iter([protocol.Prompt(i, "q", "a", (1, 2)) for i in range(5)])
    coord = coordinator.Coordinator(source, coordinator.Config(samples_per_prompt=1, buffer_groups=7))
    coord.register("g0")
    leases = coord.lease("g0", 3).leases
    sample = protocol.Sample([3, 4], [-0.1, -0.2], [0, 0], 1.0, "stop")
    coord.submit(
        protocol.RolloutGroup(leases[0].lease_id, leases[0].prompt.prompt_id, [1, 2], [sample], "g0")
    )
    coord.submit(protocol.RolloutGroup("bogus", 0, [1, 2], [sample], "g0"))

    m = metrics.WorkerMetrics(role="trainer")
    m.watch_coordinator(coord.stats)
    m.add_generated_tokens(1200)
    m.add_trained_tokens(800)
    m.weight_version.set(4)
    m.observe_lag(1.5, 3)
    m.reward.set(0.25)
    m.step_seconds.observe(0.2)
    endpoint = m.serve(port=0, host="127.0.0.1")
    try:
        got = scrape(endpoint.port)
    finally:
        endpoint.close()

    assert all(name.startswith("plrl_") for name, _ in got)
    assert got[("plrl_worker_info", (("role", "trainer"),))] == 1
    assert got[("plrl_generated_tokens_total", ())] == 1200
    assert got[("plrl_trained_tokens_total", ())] == 800
    assert got[("plrl_generated_tokens_per_second", ())] > 0
    assert got[("plrl_weight_version", ())] == 4
    assert got[("plrl_lag_steps", (("stat", "max"),))] == 3
    assert got[("plrl_reward_mean", ())] == 0.25
    assert got[("plrl_step_seconds_count", ())] == 1
    assert got[("plrl_leases_outstanding", ())] == 2
    assert got[("plrl_rollout_buffer_groups", ())] == 1
    assert got[("plrl_rollout_buffer_capacity", ())] == 7
    assert got[("plrl_prompt_queue_depth", ())] == 0
    assert got[("plrl_prompts", (("state", "issued"),))] == 3
    assert got[("plrl_prompts", (("state", "buffered"),))] == 1
    assert got[("plrl_rpc_refused_total", (("reason", "NOT_FOUND"),))] == 1


def test_rate_meter_counts_only_its_window() -> None:
    now = [0.0]
    meter = metrics.RateMeter(window_s=10.0, clock=lambda: now[0])
    now[0] = 5.0
    meter.add(50)
    assert meter.rate() == 10.0  # 50 events over the 5 s since start
    now[0] = 20.0
    meter.add(30)
    assert meter.rate() == 3.0  # the first batch left the 10 s window
    assert meter.in_window() == 30


def test_a_generators_capacity_ignores_the_time_it_waited() -> None:
    m = metrics.WorkerMetrics(role="generator")
    assert m.generated_tokens_per_decoding_second() == 0.0  # nothing decoded yet: no estimate
    m.add_generated_tokens(600)
    m.add_decoding_seconds(1.5)
    m.add_decoding_seconds(0.5)
    # However long it then sat waiting for leases, 600 tokens in 2 s of decoding is 300 tokens/s.
    assert m.generated_tokens_per_decoding_second() == 300.0
