"""How long a generator takes to register again once a restarted coordinator listens (not a test).

When trainer rank 0 restarts, its generators keep calling `Register` (gRPC `wait_for_ready`) on a
channel whose connection attempts are refused until the new rank 0 serves. gRPC spaces those
attempts by its reconnect back-off, so the delay between "the coordinator listens" and "the
generator is registered" grows with the outage. Each repeat: a client starts `Register` against a
port nothing listens on, `--outage-s` later a real coordinator (`rpc.server`) starts there, and the
delay from its start to the registration is measured, for gRPC's default back-off and for the one
`rpc.client.CoordinatorClient` uses, alternated within each round. Printed: median (min-max) per
setting and the ratio of the medians.

    .venv/bin/python bench/reconnect_after_outage.py [--repeats 3] [--outage-s 20]
"""

from __future__ import annotations

import argparse
import pathlib
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterator

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import stats
from plrl_workers import protocol
from plrl_workers.coordinator import core as coordinator
from plrl_workers.rpc import client, limits, server

TOKEN = "bench-token"
SETTINGS: dict[str, float | None] = {
    "gRPC default": None,
    "CoordinatorClient": client.MAX_RECONNECT_BACKOFF_S,
}


def _prompts() -> Iterator[protocol.Prompt]:
    for i in range(1_000):
        yield protocol.Prompt(prompt_id=i, text="q", answer="a", token_ids=(1, 2, 3))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def delay_after_outage(max_backoff_s: float | None, outage_s: float) -> float:
    """Seconds from the coordinator's start to a registration that was waiting `outage_s` for it."""
    port = _free_port()
    cli = client.CoordinatorClient(f"127.0.0.1:{port}", TOKEN, max_reconnect_backoff_s=max_backoff_s)
    registered: list[float] = []

    def register() -> None:
        cli.register("gen-0")
        registered.append(time.monotonic())

    caller = threading.Thread(target=register)
    caller.start()
    time.sleep(outage_s)
    coord = coordinator.Coordinator(_prompts(), coordinator.Config(samples_per_prompt=2))
    listening = time.monotonic()
    srv = server.serve(
        coord, token=TOKEN, host="127.0.0.1", port=port, call_limits=limits.CallLimits(max_workers=8)
    )
    caller.join(timeout=600)
    srv.stop(0)
    cli.close()
    if not registered:
        raise RuntimeError("the registration never completed")
    return registered[0] - listening


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--outage-s", type=float, default=20.0, help="how long nothing listens")
    args = ap.parse_args()
    delays: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for r in range(args.repeats):
        for name, backoff in SETTINGS.items():  # alternated within each round
            delays[name].append(delay_after_outage(backoff, args.outage_s))
            print(f"round {r + 1}: {name}: {delays[name][-1]:.2f} s", flush=True)
    print(f"registration delay after a {args.outage_s:g} s outage, median (min-max) of {args.repeats}:")
    for name, xs in delays.items():
        print(f"  {name:18s} {stats.fmt_spread(xs, '.2f')} s")
    fast = statistics.median(delays["CoordinatorClient"])
    print(f"  ratio default/ours {statistics.median(delays['gRPC default']) / max(fast, 1e-3):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
