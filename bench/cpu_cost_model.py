"""Why pipelining gains little at large batch on 2 CPU cores: per-sample costs and the model's ratio.

Measures, for the demo's tiny model and task shape (11-token prompts, 10 new tokens, 8 samples per
prompt), the CPU seconds to *generate* one sample with the torch engine at decode batch 8..64 and to
*train* on one (forward + backward in 512-token packed micro-batches + Adam). Then it predicts the
pipeline / conventional throughput ratio on 2 workers, the same way `plrl plan` does for GPUs:

    pipeline (1 generator + 1 trainer): time per sample = max(gen(H), train)
    conventional (2 workers):           time per sample = (gen(min(B/2, H)) + train) / 2

and prints it next to the ratios `bench/pipeline_vs_conventional.py` measures (BENCHMARKS.md).
Each of `--repeats` rounds measures every cost (each the best of 3 timings) and predicts the ratios
from its own costs; costs and predictions print as the median (min-max) over the rounds.

    .venv/bin/python bench/cpu_cost_model.py [--repeats 3] [--samples 128]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench import stats
from plrl_workers.engines import base, factory
from plrl_workers.models import tiny

PROMPT_TOKENS, NEW_TOKENS, G = 11, 10, 8


def gen_seconds_per_sample(model_dir: str, batch: int, samples: int, eos: int) -> float:
    engine = factory.generation_engine(
        "torch", base.EngineOptions(model_dir, batch, 32, device="cpu", seed=0)
    )
    params = base.SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, stop_token_ids=(eos,))
    prompt = list(range(3, 3 + PROMPT_TOKENS))
    best = float("inf")
    for _ in range(3):
        todo, done = samples, 0
        t0 = time.perf_counter()
        while done < samples:
            while todo and engine.num_in_flight() < batch:
                engine.add_request(f"r{todo}", prompt, params)
                todo -= 1
            done += len(engine.step())
        best = min(best, (time.perf_counter() - t0) / samples)
    engine.close()
    return best


def train_seconds_per_sample(model_dir: str, samples: int, micro_tokens: int = 512) -> float:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    seq = PROMPT_TOKENS + NEW_TOKENS
    per_mb = micro_tokens // seq
    ids = torch.randint(3, 40, (1, per_mb * seq))
    pos = torch.arange(seq).repeat(per_mb)[None]
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(-(-samples // per_mb)):
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
            torch.logsumexp(logits.float(), dim=-1).mean().backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad()
        best = min(best, (time.perf_counter() - t0) / samples)
    return best


JOBS = (
    ("examples/local-tiny.yaml", 128, 16),
    ("bench/jobs/small-batch.yaml", 32, 64),
    ("bench/jobs/batch-16.yaml", 16, 64),
)
BATCHES = (8, 16, 32, 64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=128, help="samples per measurement (one demo batch)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of every measurement")
    args = ap.parse_args()
    if args.repeats < 1 or args.samples < 1:
        ap.error("--repeats and --samples must be at least 1")
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()  # one "Loading weights" bar per measurement
    gen: dict[int, list[float]] = {b: [] for b in BATCHES}
    train: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(tiny.build(tmp))
        eos = tiny.vocabulary()[tiny.EOS]
        for _ in range(args.repeats):
            for b in BATCHES:
                gen[b].append(gen_seconds_per_sample(model_dir, b, args.samples, eos))
            train.append(train_seconds_per_sample(model_dir, args.samples))
    print(f"ms per sample, median (min-max) of {args.repeats} rounds:")
    for b in BATCHES:
        print(f"  generate at decode batch {b:<3} {stats.fmt_spread(gen[b], '.2f', scale=1e3)}")
    print(f"  train                     {stats.fmt_spread(train, '.2f', scale=1e3)}")
    print(f"\n{'job':<34}{'B':>5}{'H':>5}  predicted pipeline / conventional")
    for name, b, h in JOBS:
        predicted = [
            (gen[min(b // 2, h)][r] + train[r]) / 2 / max(gen[h][r], train[r]) for r in range(args.repeats)
        ]
        print(f"{name:<34}{b:>5}{h:>5}  {stats.fmt_spread(predicted, '.2f', 'x')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
