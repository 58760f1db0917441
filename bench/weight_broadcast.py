"""Weight broadcast over gloo: our bucketed path against a raw broadcast of one flat buffer (the limit).

Two receiver processes on 127.0.0.1. Each round is timed from the sender's first action to the
moment both receivers report that they hold every tensor:

  raw       - one `broadcast` of a pre-packed flat uint8 buffer of the model's size
  plrl      - `WeightBroadcaster.broadcast` on the named parameters: announcement, per-version
              handshake, packing into buckets (overlapped with sending), bucketed broadcast, and on
              the receivers `WeightReceiver.receive` yielding every named tensor

It also prints the pause a generator sees per update (time inside `receive()`, median over rounds
and receivers) and the ratio plrl/raw per bucket size; in the last row the receivers reuse their
buffers (`reuse_buffers=True`). Goal: within 1.3x of raw for a ~50 MB model.

    .venv/bin/python bench/weight_broadcast.py [--mb 50] [--rounds 5] [--buckets-mb 8,16,32,64]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from typing import Any


def _receiver(conn: Any, threads: int) -> None:
    import torch

    from plrl_workers import stores
    from plrl_workers.weight_sync import groups, receiver

    torch.set_num_threads(threads)
    rx = None
    raw_pg = None
    raw_buf = None
    while True:
        msg = conn.recv()
        kind = msg[0]
        if kind == "exit":
            break
        if kind == "ours":
            _, group, ann, reuse = msg
            if rx is None or rx.group != group:
                if rx is not None:
                    rx.close()
                rx = receiver.WeightReceiver(group, "cpu", reuse_buffers=reuse)
            start = time.perf_counter()
            got = list(rx.receive(ann))
            conn.send(("done", time.perf_counter() - start, len(got)))
        elif kind == "raw_join":
            _, host, port, rank, world, nbytes = msg
            store = stores.tcp_store(host, port, is_master=False, timeout_s=120)
            raw_pg = groups.new_process_group(
                groups.epoch_store(store, -1),
                rank=rank,
                world_size=world,
                backend="gloo",
                timeout_s=120,
                gloo_host=host,
            )
            raw_buf = torch.empty(nbytes, dtype=torch.uint8)
            conn.send(("joined",))
        elif kind == "raw_go":
            assert raw_pg is not None and raw_buf is not None
            start = time.perf_counter()
            groups.broadcast_async(raw_pg, raw_buf).wait()
            conn.send(("done", time.perf_counter() - start, 1))
    if rx is not None:
        rx.close()


def _model(mb: float) -> dict[str, Any]:
    """A transformer-shaped set of float32 tensors of about `mb` megabytes."""
    import torch

    hidden = 512
    named: dict[str, Any] = {"embed.weight": torch.randn(5000, hidden)}
    layer = 0
    while sum(t.numel() * 4 for t in named.values()) < mb * 1e6 - 4.2e6:
        p = f"layers.{layer}."
        for proj in ("q", "k", "v", "o"):
            named[p + f"attn.{proj}.weight"] = torch.randn(hidden, hidden)
        named[p + "mlp.up.weight"] = torch.randn(2 * hidden, hidden)
        named[p + "mlp.down.weight"] = torch.randn(hidden, 2 * hidden)
        named[p + "norm.weight"] = torch.randn(hidden)
        layer += 1
    return named


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=50.0, help="model size in MB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--buckets-mb", default="8,16,32,64", help="bucket sizes to try, MB (16 is the default)")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads per process (copies; 1 on a busy box)"
    )
    args = ap.parse_args()

    import torch

    from plrl_workers import stores
    from plrl_workers.weight_sync import groups, sender

    torch.set_num_threads(args.threads)
    named = _model(args.mb)
    nbytes = sum(t.numel() * t.element_size() for t in named.values())
    ctx = multiprocessing.get_context("spawn")
    pipes = []
    procs = []
    for _ in range(2):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_receiver, args=(child, args.threads), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)

    def wait_done() -> list[float]:
        return [p.recv()[1] for p in pipes]

    # Raw limit: one flat buffer over a plain gloo group of the same three ranks.
    store = stores.tcp_store("127.0.0.1", 0, is_master=True, timeout_s=300)
    for rank, p in enumerate(pipes, start=1):
        p.send(("raw_join", "127.0.0.1", store.port, rank, 3, nbytes))
    raw_pg = groups.new_process_group(
        groups.epoch_store(store, -1),
        rank=0,
        world_size=3,
        backend="gloo",
        timeout_s=300,
        gloo_host="127.0.0.1",
    )
    for p in pipes:
        assert p.recv() == ("joined",)
    flat = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    raw = []
    for _ in range(args.rounds + 1):
        start = time.perf_counter()
        for p in pipes:
            p.send(("raw_go",))
        groups.broadcast_async(raw_pg, flat).wait()
        wait_done()
        raw.append(time.perf_counter() - start)
    raw = raw[1:]  # the first round connects the pairs

    results = []
    configs = [(float(x), False) for x in args.buckets_mb.split(",")] + [(16.0, True)]
    for bucket_mb, reuse in configs:
        bc = sender.WeightBroadcaster(advertise_host="127.0.0.1", bucket_bytes=int(bucket_mb * 2**20))

        def announce(member: str, group: Any, ann: Any, reuse: bool = reuse) -> bool:
            pipes[int(member)].send(("ours", group, ann, reuse))
            return True

        times, pauses = [], []
        for version in range(args.rounds + 1):
            start = time.perf_counter()
            bc.broadcast(version, named.items(), ["0", "1"], announce)
            pause = wait_done()
            if version:  # version 0 builds the group
                times.append(time.perf_counter() - start)
                pauses.extend(pause)
        bc.close()
        results.append((bucket_mb, reuse, times, pauses))

    for p in pipes:
        p.send(("exit",))
    for proc in procs:
        proc.join(timeout=30)

    gb = nbytes / 1e9
    best_raw = min(raw)
    print(f"weight broadcast over gloo, 127.0.0.1: {nbytes / 1e6:.1f} MB, {len(named)} tensors, 2 receivers")
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs; torch threads {args.threads}")
    print(f"seconds: best of {args.rounds} rounds (median); ratio: vs raw, best (median)")
    print(f"{'path':<32} {'seconds':>16} {'GB/s':>6} {'pause ms':>9} {'ratio':>14}")
    med_raw = statistics.median(raw)
    print(f"{'raw flat buffer':<32} {best_raw:7.3f} ({med_raw:6.3f}) {gb / best_raw:6.2f}")
    for bucket_mb, reuse, times, pauses in results:
        best = min(times)
        name = f"plrl, {bucket_mb:g} MB buckets" + (", rx reuse" if reuse else "")
        med = statistics.median(times)
        print(
            f"{name:<32} {best:7.3f} ({med:6.3f}) {gb / best:6.2f} "
            f"{statistics.median(pauses) * 1e3:9.1f} {best / best_raw:6.2f} ({med / med_raw:5.2f})"
        )
    print("goal: ratio <= 1.3")


if __name__ == "__main__":
    main()
