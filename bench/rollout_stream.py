"""Rollout streaming over loopback gRPC: MB/s and rollouts/s from a generator into the coordinator.

The coordinator (with its token check, validation and bounded buffer, drained by a stand-in trainer
thread) runs in its own process, as in production; this process plays the generator: it leases
prompts and streams one RolloutGroup per lease on one SubmitRollouts stream. Two rows:

  typed client   - `CoordinatorClient.submit_rollouts` on `protocol.RolloutGroup`s (encoding included)
  pre-encoded    - the same groups encoded beforehand: the transport + server side alone

MB/s counts serialized message bytes; each repeat runs both rows, their order swapped every other
repeat, and each figure is the median (min-max) over `--repeats` runs, the typed/pre-encoded
ratio the median of the per-repeat ratios. A last
section splits the per-group CPU time in one process: the client's encoding, the server's parse
and decode (zero-copy numpy views into `protocol.Sample`) and the coordinator's per-token checks.
Goal: >= 100 MB/s.

    .venv/bin/python bench/rollout_stream.py [--groups 400] [--samples 8] [--tokens 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import multiprocessing.queues
import multiprocessing.synchronize
import os
import pathlib
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench import stats  # after the path insert: run as a script from the repo root

if TYPE_CHECKING:
    from plrl_workers import protocol

TOKEN = "bench-token"


def _prompts() -> Iterator[protocol.Prompt]:
    from plrl_workers import protocol

    i = 0
    while True:
        yield protocol.Prompt(prompt_id=i, text="q", answer="a", token_ids=tuple(range(128)))
        i += 1


def _serve(
    port_q: multiprocessing.queues.Queue[int], stop: multiprocessing.synchronize.Event, samples: int
) -> None:
    from plrl_workers.coordinator import core as coordinator
    from plrl_workers.rpc import limits, server

    coord = coordinator.Coordinator(
        _prompts(),
        coordinator.Config(samples_per_prompt=samples, buffer_groups=256, lease_timeout_s=3600),
    )

    def trainer() -> None:
        step = 0
        while not stop.is_set():
            if coord.take(32, timeout_s=0.2):
                step += 1
                coord.finish_step(step)

    threading.Thread(target=trainer, daemon=True).start()
    srv = server.serve(
        coord, token=TOKEN, host="127.0.0.1", port=0, call_limits=limits.CallLimits(max_workers=16)
    )
    port_q.put(srv.port)
    stop.wait()
    srv.stop(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=400, help="rollout groups per run")
    ap.add_argument("--samples", type=int, default=8, help="G: samples per group")
    ap.add_argument("--tokens", type=int, default=1024, help="completion tokens per sample")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)

    import numpy

    from plrl_workers import protocol
    from plrl_workers.rpc import auth, client, convert
    from plrl_workers.rpc.generated import plrl_pb2_grpc as pb_grpc

    ctx = multiprocessing.get_context("spawn")
    port_q: multiprocessing.queues.Queue[int] = ctx.Queue()
    stop = ctx.Event()
    proc = ctx.Process(target=_serve, args=(port_q, stop, args.samples), daemon=True)
    proc.start()
    port = port_q.get(timeout=300)
    rng = numpy.random.default_rng(0)

    def groups_for(leases: list[protocol.Lease], newest: int = 1) -> list[protocol.RolloutGroup]:
        n = args.tokens
        out = []
        for lease in leases:
            out.append(
                protocol.RolloutGroup(
                    lease_id=lease.lease_id,
                    prompt_id=lease.prompt.prompt_id,
                    prompt_token_ids=list(lease.prompt.token_ids),
                    samples=[
                        protocol.Sample(
                            token_ids=rng.integers(0, 150_000, n, dtype=numpy.int32),
                            logprobs=-rng.random(n, dtype=numpy.float32),
                            versions=[0] * (n // 2) + [newest] * (n - n // 2),  # updated mid-sample
                            reward=1.0,
                            finish_reason="length",
                        )
                        for _ in range(args.samples)
                    ],
                    generator_id="bench-gen",
                )
            )
        return out

    modes = ("typed client", "pre-encoded")
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}  # (MB/s, groups/s) per run
    with client.CoordinatorClient(f"127.0.0.1:{port}", TOKEN) as c:
        c.register("bench-gen")
        while c.status().weight_version < 1:  # until the trainer is at version 1, send version 0
            c.submit(groups_for(c.lease_prompts("bench-gen", 32).leases, newest=0))
        stub = pb_grpc.CoordinatorStub(c._channel)
        for r in range(args.repeats):
            for mode in modes if r % 2 == 0 else reversed(modes):
                leases: list[protocol.Lease] = []
                while len(leases) < args.groups:
                    leases += c.lease_prompts("bench-gen", min(1024, args.groups - len(leases))).leases
                groups = groups_for(leases)
                encoded = [convert.group_to_pb(g) for g in groups]
                nbytes = sum(m.ByteSize() for m in encoded)
                start = time.perf_counter()
                if mode == "typed client":
                    acks = [r.ok for r in c.submit_rollouts(iter(groups))]
                else:
                    acks = [
                        a.code == 0 for a in stub.SubmitRollouts(iter(encoded), metadata=auth.metadata(TOKEN))
                    ]
                seconds = time.perf_counter() - start
                assert all(acks) and len(acks) == len(groups), "some groups were refused"
                results[mode].append((nbytes / seconds / 1e6, len(groups) / seconds))
    stop.set()
    proc.join(timeout=30)

    per_group = args.samples * args.tokens
    print(f"rollout streaming, loopback gRPC: {args.groups} groups x G={args.samples} x {args.tokens} tokens")
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs; median (min-max) of {args.repeats} runs")
    print(f"{'mode':<14} {'MB/s':<22} {'groups/s':>9} {'samples/s':>10} {'tokens/s':>11}")
    for mode in modes:
        gps = statistics.median(g for _, g in results[mode])
        mbs = stats.fmt_spread([m for m, _ in results[mode]], ".1f")
        print(f"{mode:<14} {mbs:<22} {gps:9.1f} {gps * args.samples:10.0f} {gps * per_group:11.0f}")
    typed, pre = ([g for _, g in results[m]] for m in modes)
    print(f"goal >= 100 MB/s; typed/pre-encoded ratio {stats.fmt_spread(stats.ratios(typed, pre), '.2f')}")
    _server_split(args.samples, args.tokens)


def _server_split(samples: int, tokens: int) -> None:
    """Per-group CPU of encoding, decoding and checking, in this process, split by stage."""
    import numpy

    from plrl_workers import protocol
    from plrl_workers.coordinator import checks
    from plrl_workers.rpc import convert
    from plrl_workers.rpc.generated import plrl_pb2 as pb

    rng = numpy.random.default_rng(1)
    prompt = protocol.Prompt(0, "q", "a", tuple(range(128)))
    group = protocol.RolloutGroup(
        "lease",
        prompt.prompt_id,
        list(prompt.token_ids),
        [
            protocol.Sample(
                rng.integers(0, 150_000, tokens, dtype=numpy.int32),
                -rng.random(tokens, dtype=numpy.float32),
                [0] * tokens,
                1.0,
                "length",
            )
            for _ in range(samples)
        ],
        "gen",
    )
    wire = convert.group_to_pb(group).SerializeToString()

    def timed(fn: Callable[[], object], reps: int = 50) -> float:
        best = math.inf
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        return best

    decoded = convert.group_from_pb(pb.RolloutGroup.FromString(wire))
    stages = [
        ("client: encode types -> bytes", timed(lambda: convert.group_to_pb(group).SerializeToString())),
        (
            "server: parse + decode (numpy views)",
            timed(lambda: convert.group_from_pb(pb.RolloutGroup.FromString(wire))),
        ),
        (
            "coordinator: per-token checks",
            timed(lambda: checks.check_group(decoded, prompt, samples_per_prompt=samples, current_version=1)),
        ),
    ]
    print(f"per-group CPU, one process, best of 50 ({len(wire) / 1e3:.0f} KB per group):")
    for name, seconds in stages:
        print(f"  {name:<40} {seconds * 1e6:8.0f} us  = {len(wire) / seconds / 1e6:7.0f} MB/s per core")


if __name__ == "__main__":
    main()
