"""Weight broadcast over gloo: our bucketed path against a raw broadcast of one flat buffer (the limit).

Two receiver processes on 127.0.0.1. Each round is timed from the sender's first action to the
moment both receivers report that they hold every tensor:

  raw       - one `broadcast` of a pre-packed flat uint8 buffer of the model's size
  plrl      - `WeightBroadcaster.broadcast` on the named parameters: announcement, per-version
              handshake, packing into buckets (overlapped with sending), bucketed broadcast, and on
              the receivers `WeightReceiver.receive` yielding every named tensor

Variants: raw, plrl at each of `--buckets-mb`, and plrl at 16 MB with the receivers reusing their
buffers (`reuse_buffers=True`). Every repeat measures each variant once, in turn (the order rotates
by one each repeat, so drift in machine load hits them alike): `--rounds` timed rounds after an
untimed one (plrl's builds its group; raw's first ever connects the pairs), and the repeat's figure
is the median over those rounds. Printed: the command line, one line per (repeat, variant), then per
variant as median (min-max) over the repeats: seconds per update, GB/s, the pause a generator sees
per update (time inside `receive()`, median over rounds and receivers) and the headline ratio
plrl / raw seconds, the median (min-max) of the per-repeat ratios. Goal: within 1.3x of raw for a
~50 MB model.

    .venv/bin/python bench/weight_broadcast.py --repeats 3 --rounds 10   # full size: 50 MB model
    .venv/bin/python bench/weight_broadcast.py --repeats 2 --rounds 1 --mb 12 --buckets-mb 4,16  # smoke
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pathlib
import shlex
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import stats


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
    ap.add_argument("--mb", type=float, default=50.0, help="model size in MB (at least ~10)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per variant and repeat")
    ap.add_argument("--repeats", type=int, default=3, help="passes over all variants, alternated")
    ap.add_argument("--buckets-mb", default="8,16,32,64", help="bucket sizes to try, MB (16 is the default)")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads per process (copies; 1 on a busy box)"
    )
    args = ap.parse_args()
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats must be at least 1")
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)

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

    def raw_rounds(n: int) -> list[float]:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            for p in pipes:
                p.send(("raw_go",))
            groups.broadcast_async(raw_pg, flat).wait()
            wait_done()
            times.append(time.perf_counter() - start)
        return times

    def plrl_rounds(n: int, bucket_mb: float, reuse: bool) -> tuple[list[float], list[float]]:
        bc = sender.WeightBroadcaster(advertise_host="127.0.0.1", bucket_bytes=int(bucket_mb * 2**20))

        def announce(member: str, group: Any, ann: Any) -> bool:
            pipes[int(member)].send(("ours", group, ann, reuse))
            return True

        times, pauses = [], []
        for version in range(n + 1):
            start = time.perf_counter()
            bc.broadcast(version, named.items(), ["0", "1"], announce)
            pause = wait_done()
            if version:  # version 0 builds the group
                times.append(time.perf_counter() - start)
                pauses.extend(pause)
        bc.close()
        return times, pauses

    raw_rounds(1)  # the first round connects the pairs
    raw = "raw flat buffer"
    variants: dict[str, tuple[float, bool] | None] = {raw: None}
    for mb in (float(x) for x in args.buckets_mb.split(",")):
        variants[f"plrl, {mb:g} MB buckets"] = (mb, False)
    variants["plrl, 16 MB buckets, rx reuse"] = (16.0, True)
    names = list(variants)
    secs: dict[str, list[float]] = {name: [] for name in names}  # per repeat: median of its rounds
    pause_ms: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(args.repeats):
        k = rep % len(names)
        for name in names[k:] + names[:k]:  # rotated, so each repeat alternates all variants
            config = variants[name]
            if config is None:
                times = raw_rounds(args.rounds)
            else:
                times, pauses = plrl_rounds(args.rounds, *config)
                pause_ms[name].append(statistics.median(pauses) * 1e3)
            secs[name].append(statistics.median(times))
            pause = f", pause {pause_ms[name][-1]:.1f} ms" if config is not None else ""
            print(
                f"repeat {rep + 1} {name}: {secs[name][-1]:.3f} s (median of {args.rounds} rounds){pause}",
                flush=True,
            )

    for p in pipes:
        p.send(("exit",))
    for proc in procs:
        proc.join(timeout=30)

    gb = nbytes / 1e9
    print(f"weight broadcast over gloo, 127.0.0.1: {nbytes / 1e6:.1f} MB, {len(named)} tensors, 2 receivers")
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs; torch threads {args.threads}")
    print(
        f"median (min-max) over {args.repeats} repeats of each repeat's median of {args.rounds} rounds; "
        "ratio: plrl / raw seconds within each repeat"
    )
    print(f"{'path':<30} {'seconds':>20} {'GB/s':>17} {'pause ms':>17} {'ratio':>18}")
    for name in names:
        gbs = [gb / t for t in secs[name]]
        ratio = stats.ratios(secs[name], secs[raw]) if name != raw else []
        print(
            f"{name:<30} {stats.fmt_spread(secs[name], '.3f'):>20} {stats.fmt_spread(gbs, '.2f'):>17} "
            f"{stats.fmt_spread(pause_ms[name], '.1f'):>17} {stats.fmt_spread(ratio, '.2f', 'x'):>18}"
        )
    print("goal: ratio <= 1.3")


if __name__ == "__main__":
    main()
