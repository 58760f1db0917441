"""Trained tokens/s of the training backends on the tiny model: torch DDP vs DeepSpeed ZeRO-1/2,
1 rank vs 2 ranks (CPU, gloo on loopback), side by side.

    .venv/bin/python bench/trainer_backends.py --repeats 3   # full size: all six, 5 steps each
    .venv/bin/python bench/trainer_backends.py --repeats 2 --only ddp:1,zero1:1 --steps 1 \
        --groups 2 --g 2 --max-new 16   # smoke run

Each configuration starts its ranks as separate processes, trains one warm-up step, then times
`--steps` optimizer steps of synthetic rollouts (the same for every configuration). Tokens counted
are all tokens fed to the model (prompt + completion), over all ranks. Engine start-up is reported
separately. Every repeat launches each configuration once, in turn (the order rotates by one each
repeat), so drift in machine load hits them alike. Printed: the command line, one line per launch,
then per configuration tokens/s, step seconds and start-up seconds as median (min-max) over the
repeats, and the ratio to the first configuration (ddp x1 unless `--only` leaves it out) as the
median (min-max) of the per-repeat ratios. Numbers on a shared 2-core machine are noisy: compare
the ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import shlex
import sys
import tempfile
import time

from plrl_workers import protocol
from plrl_workers.engines import factory

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import stats
from tests.infra import procs

CONFIGS = [
    ("torch", 1, 1),
    ("deepspeed", 1, 1),
    ("deepspeed", 2, 1),
    ("torch", 1, 2),
    ("deepspeed", 1, 2),
    ("deepspeed", 2, 2),
]


def _groups(step: int, version: int, n_groups: int, g: int, max_new: int) -> list[protocol.RolloutGroup]:
    rng = random.Random(step)
    out = []
    for k in range(n_groups):
        prompt = [rng.randrange(4, 80) for _ in range(rng.randint(12, 24))]
        samples = []
        for _ in range(g):
            n = rng.randint(max_new // 4, max_new)
            samples.append(
                protocol.Sample(
                    [rng.randrange(4, 80) for _ in range(n)],
                    [-rng.uniform(0.2, 4.0) for _ in range(n)],
                    [version] * n,
                    float(rng.random() < 0.5),
                    "stop",
                )
            )
        out.append(protocol.RolloutGroup(f"l{step}-{k}", step * 1000 + k, prompt, samples, "gen"))
    return out


def rank_main(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from plrl_workers.engines import training
    from plrl_workers.models import tiny
    from plrl_workers.rl import step

    t0 = time.perf_counter()
    training.init_distributed(training.Rendezvous("127.0.0.1", args.port, args.rank, args.world_size))
    cfg = training.TrainEngineConfig(
        model_path=str(tiny.build(args.model_dir)),
        backend=args.backend,
        zero_stage=args.stage,
        learning_rate=1e-5,
        gradient_clipping=1.0,
    )
    engine = factory.training_engine(cfg)
    init_s = time.perf_counter() - t0
    rl = step.RLConfig(tokens_per_micro_batch=args.tokens_per_micro_batch)
    tokens, elapsed = 0.0, 0.0
    for i in range(args.steps + 1):
        groups = _groups(i, engine.version, args.groups, args.g, args.max_new)
        prep = step.prepare(groups, engine.version, engine.world_size, rl)
        dist.barrier()
        t = time.perf_counter()
        m = step.train_step(engine, prep.micro_batches[engine.rank], rl)
        if i > 0:  # step 0 is warm-up
            elapsed += time.perf_counter() - t
            tokens += m["input_tokens"]
    if engine.rank == 0:
        print(
            json.dumps({"tokens_per_s": tokens / elapsed, "init_s": init_s, "step_s": elapsed / args.steps})
        )
    engine.close()
    dist.destroy_process_group()


def launch(args: argparse.Namespace, backend: str, stage: int, ranks: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--backend", backend, "--stage", str(stage)]
    cmd += ["--model-dir", args.model_dir, "--steps", str(args.steps), "--groups", str(args.groups)]
    cmd += ["--g", str(args.g), "--max-new", str(args.max_new)]
    cmd += ["--tokens-per-micro-batch", str(args.tokens_per_micro_batch)]
    out = procs.run_ranks(cmd, ranks, threads=args.threads)[0]
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    procs.add_rank_arguments(ap)
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--model-dir", default=str(pathlib.Path(tempfile.gettempdir()) / "plrl-bench-tiny"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--tokens-per-micro-batch", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1, help="OMP threads per rank")
    ap.add_argument("--only", default="", help="comma-separated subset, e.g. ddp:2,zero2:1")
    ap.add_argument("--repeats", type=int, default=3, help="launches of each configuration, alternated")
    args = ap.parse_args()
    if args.rank_worker:
        rank_main(args)
        return
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    configs = []
    for backend, stage, ranks in CONFIGS:
        name = "ddp" if backend == "torch" else f"zero{stage}"
        if not args.only or f"{name}:{ranks}" in args.only.split(","):
            configs.append((name, backend, stage, ranks))
    if not configs:
        ap.error(f"--only {args.only!r} matches none of the configurations")
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)
    results: dict[tuple[str, int], list[dict[str, float]]] = {(c[0], c[3]): [] for c in configs}
    for rep in range(args.repeats):
        k = rep % len(configs)
        for name, backend, stage, ranks in configs[k:] + configs[:k]:  # rotated: alternated fairly
            r = launch(args, backend, stage, ranks)
            results[name, ranks].append(r)
            tps, step_s, init_s = r["tokens_per_s"], r["step_s"], r["init_s"]
            print(
                f"repeat {rep + 1} {name:6s} x{ranks}: {tps:8.0f} tok/s  step {step_s:.2f}s  "
                f"init {init_s:.0f}s",
                flush=True,
            )
    base_key = (configs[0][0], configs[0][3])
    base = [r["tokens_per_s"] for r in results[base_key]]
    print(f"\nbatch: {args.groups} prompts x G={args.g}, completions <= {args.max_new} tokens, ", end="")
    print(f"{args.threads} thread(s) per rank; median (min-max) of {args.repeats} repeats")
    vs = f"vs {base_key[0]} x{base_key[1]}"
    print(f"{'backend':8s} {'ranks':>5s} {'tok/s':>20s} {'step s':>18s} {'init s':>14s} {vs:>20s}")
    for (name, ranks), rs in results.items():
        tok_s = [r["tokens_per_s"] for r in rs]
        print(
            f"{name:8s} {ranks:5d} {stats.fmt_spread(tok_s, '.0f'):>20s} "
            f"{stats.fmt_spread([r['step_s'] for r in rs], '.2f'):>18s} "
            f"{stats.fmt_spread([r['init_s'] for r in rs], '.0f'):>14s} "
            f"{stats.fmt_spread(stats.ratios(tok_s, base), '.2f', 'x'):>20s}"
        )


if __name__ == "__main__":
    main()
