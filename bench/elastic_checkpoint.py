"""Time to save a trainer checkpoint at W=2 ranks and to load it at W'=1 (the autoscaler's elastic
restart; for DeepSpeed the re-cut of the ZeRO partitions is inside the load), next to a load at the
world size that wrote it, on the tiny model (CPU, gloo on loopback).

    .venv/bin/python bench/elastic_checkpoint.py [--runs torch,zero1,zero2] [--repeats 3]

Two launches, one process per rank: 2 ranks train one step (so Adam's state exists) and save
`--repeats` checkpoints (after an untimed one: the first save in a process pays one-time imports,
~2 s); then 1 rank trains a step, saves its own, and loads alternately its own (same size) and the
2-rank one (cross size), `--repeats` times each, into the same engine. Times are
`checkpoint.save` / `checkpoint.load` wall time on rank 0 (collective, so the slowest rank's),
reported as median (min-max). Engine start-up is not timed. Noisy on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Literal

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import stats
from tests.infra import procs

RUNS: dict[str, tuple[Literal["torch", "deepspeed"], int]] = {
    "torch": ("torch", 1),
    "zero1": ("deepspeed", 1),
    "zero2": ("deepspeed", 2),
}


def _timed(fn: Callable[[], object]) -> float:
    import torch.distributed as dist

    dist.barrier()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def rank_main(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from plrl_workers import checkpoint, checkpoint_manifest, protocol
    from plrl_workers.engines import factory, training
    from plrl_workers.rl import step

    key = checkpoint_manifest.signing_key("bench")  # as a job's token derives it

    training.init_distributed(training.Rendezvous("127.0.0.1", args.port, args.rank, args.world_size))
    world, work = dist.get_world_size(), pathlib.Path(args.work)
    rl = step.RLConfig(tokens_per_micro_batch=64)
    samples = [protocol.Sample([5 + i, 6, 7, 8], [-1.0] * 4, [0] * 4, float(i % 2), "stop") for i in range(4)]
    groups = [protocol.RolloutGroup(f"l{k}", k, [4, 5, 6], samples, "gen") for k in range(4)]
    report: dict[str, dict[str, list[float]]] = {}
    for run in args.runs.split(","):
        backend, stage = RUNS[run]
        cfg = training.TrainEngineConfig(
            model_path=args.model_dir, backend=backend, zero_stage=stage, learning_rate=1e-3
        )
        engine = factory.training_engine(cfg)
        step.train_step(engine, step.prepare(groups, 0, world, rl).micro_batches[engine.rank], rl)
        times: dict[str, list[float]] = {"save": [], "load_same": [], "load_cross": []}
        own = work / f"{run}.w{world}"
        checkpoint.save(
            engine, work / f"warm-up.{run}.w{world}", 0, key=key
        )  # one-time imports (safetensors...)
        for i in range(args.repeats):
            times["save"].append(
                _timed(functools.partial(checkpoint.save, engine, own, i + 1, key=key, keep=args.repeats))
            )
        if args.load_from:
            mine, other = checkpoint.latest(own), checkpoint.latest(work / f"{run}.w{args.load_from}")
            assert mine is not None and other is not None
            for _ in range(args.repeats):
                times["load_same"].append(_timed(functools.partial(checkpoint.load, engine, mine, key=key)))
                times["load_cross"].append(_timed(functools.partial(checkpoint.load, engine, other, key=key)))
        report[run] = times
        engine.close()
    if dist.get_rank() == 0:
        print(json.dumps(report))
    dist.destroy_process_group()


def launch(args: argparse.Namespace, ranks: int, load_from: int) -> dict[str, dict[str, list[float]]]:
    cmd = [sys.executable, __file__, "--model-dir", args.model_dir, "--work", args.work, "--runs", args.runs]
    cmd += ["--repeats", str(args.repeats), "--load-from", str(load_from)]
    out = procs.run_ranks(cmd, ranks)[0]
    result: dict[str, dict[str, list[float]]] = json.loads(out.strip().splitlines()[-1])
    return result


def _stat(xs: list[float]) -> str:
    """Seconds as milliseconds, median (min-max)."""
    return stats.fmt_spread(xs, ".0f", scale=1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    procs.add_rank_arguments(ap)
    ap.add_argument("--load-from", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--work", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=str(pathlib.Path(tempfile.gettempdir()) / "plrl-bench-tiny"))
    ap.add_argument("--runs", default="torch,zero1,zero2")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.rank_worker:
        rank_main(args)
        return
    from plrl_workers.models import tiny

    args.model_dir = str(tiny.build(pathlib.Path(args.model_dir)))
    with tempfile.TemporaryDirectory(prefix="plrl-elastic-") as work:
        args.work = work
        saved = launch(args, 2, 0)
        loaded = launch(args, 1, 2)
    print(f"tiny model, {args.repeats} repeats, ms as median (min-max), loads alternated same/cross size")
    print(f"{'backend':8s} {'save W=2':>16s} {'save W=1':>16s} {'load 1->1':>16s} {'load 2->1':>16s}")
    for run in args.runs.split(","):
        s, w1 = saved[run], loaded[run]
        cells = [_stat(x) for x in (s["save"], w1["save"], w1["load_same"], w1["load_cross"])]
        print(f"{run:8s} " + " ".join(f"{c:>16s}" for c in cells))


if __name__ == "__main__":
    main()
