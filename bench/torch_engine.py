"""Torch engine: continuous batching vs transformers `generate`, same batch, variable-length outputs.

Every request has its own output budget (uniform in [min_new, max_new]) and may also end at EOS.
`generate` decodes each batch of B requests until its longest member is done (it cannot stop one
row early for its own budget, so short rows ride along); the engine keeps B slots busy and refills
a slot in the step its sequence ends. Both sample at temperature 1 from the same weights and
count only useful tokens (each sequence up to its budget or first EOS).

After one untimed warm-up batch of each, every repeat times both on all `--requests` requests, one
after the other (generate first in even repeats, the engine first in odd ones), so drift in machine
load hits both alike. It prints the command line, one line per timed run, then for each method
useful tokens, seconds and tokens/s as median (min-max) over the repeats, and the headline ratio
engine / generate tokens/s as the median (min-max) of the per-repeat ratios.

    .venv/bin/python bench/torch_engine.py --repeats 3   # full size: 64 requests, hidden 256 x 4 layers
    .venv/bin/python bench/torch_engine.py --repeats 2 --requests 8 --batch 4 --max-new 16 \
        --hidden 64 --layers 1   # smoke run
"""

from __future__ import annotations

import argparse
import pathlib
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import stats
from plrl_workers.engines import base, factory
from plrl_workers.models import tiny

if TYPE_CHECKING:
    import transformers


GENERATE, ENGINE = "transformers generate", "torch engine (continuous)"


def useful(tokens: list[int], budget: int, eos: int) -> int:
    n = min(len(tokens), budget)
    return next((i + 1 for i, t in enumerate(tokens[:n]) if t == eos), n)


def run_generate(
    model: transformers.PreTrainedModel, reqs: list[tuple[list[int], int]], batch: int, eos: int
) -> int:
    total = 0
    for b in range(0, len(reqs), batch):
        chunk = reqs[b : b + batch]
        width = max(len(p) for p, _ in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, (p, _) in enumerate(chunk):  # left padding, as generate expects for decoder-only
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max(n for _, n in chunk),
            pad_token_id=0,
            eos_token_id=eos,
        )
        total += sum(useful(out[r, width:].tolist(), n, eos) for r, (_, n) in enumerate(chunk))
    return total


def run_engine(engine: base.GenerationEngine, reqs: list[tuple[list[int], int]], eos: int) -> int:
    for i, (p, n) in enumerate(reqs):
        engine.add_request(str(i), p, base.SamplingParams(max_new_tokens=n, temperature=1.0))
    total = 0
    while engine.num_in_flight():
        total += sum(useful(s.token_ids, len(s.token_ids), eos) for s in engine.step())
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="generate's batch = the engine's slots (H)")
    ap.add_argument("--min-new", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256, help="model width (head_dim stays 64)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each method, alternated")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (on a contended CPU more threads spin and slow down)",
    )
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)
    torch.set_num_threads(args.threads)

    import transformers

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    cfg = tiny.TinyModelConfig(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64,
        intermediate_size=4 * args.hidden,
    )
    chars = len(tiny.vocabulary())
    reqs = [
        (
            [rng.randrange(4, chars) for _ in range(rng.randint(8, 32))],
            rng.randint(args.min_new, args.max_new),
        )
        for _ in range(args.requests)
    ]
    eos = tiny.vocabulary()[tiny.EOS]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny.build(tmp, cfg, seed=args.seed)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model = model.to(args.device).eval()
        max_len = 32 + args.max_new
        engine = factory.generation_engine(
            "torch",
            base.EngineOptions(str(model_dir), args.batch, max_len, device=args.device, seed=args.seed),
        )
        warm = reqs[: args.batch]
        with torch.inference_mode():
            run_generate(model, warm, args.batch, eos)
            run_engine(engine, warm, eos)
            runs: dict[str, Callable[[], int]] = {
                GENERATE: lambda: run_generate(model, reqs, args.batch, eos),
                ENGINE: lambda: run_engine(engine, reqs, eos),
            }
            tokens: dict[str, list[float]] = {name: [] for name in runs}
            secs: dict[str, list[float]] = {name: [] for name in runs}
            for r in range(args.repeats):
                order = [GENERATE, ENGINE] if r % 2 == 0 else [ENGINE, GENERATE]  # alternated
                for name in order:
                    t0 = time.perf_counter()
                    n = runs[name]()
                    secs[name].append(time.perf_counter() - t0)
                    tokens[name].append(n)
                    print(
                        f"repeat {r + 1} {name}: {n} tokens {secs[name][-1]:.2f} s "
                        f"{n / secs[name][-1]:.1f} tok/s",
                        flush=True,
                    )
        engine.close()

    tok_s = {name: stats.ratios(tokens[name], secs[name]) for name in runs}
    print(
        f"{args.requests} requests, batch/slots {args.batch}, budgets {args.min_new}-{args.max_new} tokens, "
        f"model hidden {args.hidden} x {args.layers} layers, {args.device}, "
        f"torch threads {torch.get_num_threads()}; median (min-max) of {args.repeats} repeats"
    )
    print(f"  {'':28s} {'useful tokens':>22s} {'seconds':>22s} {'tokens/s':>22s}")
    for name in runs:
        print(
            f"  {name:28s} {stats.fmt_spread(tokens[name], '.0f'):>22s} "
            f"{stats.fmt_spread(secs[name], '.2f'):>22s} {stats.fmt_spread(tok_s[name], '.1f'):>22s}"
        )
    ratio = stats.ratios(tok_s[ENGINE], tok_s[GENERATE])
    print(f"  ratio engine / generate tokens/s (per repeat): {stats.fmt_spread(ratio, '.2f', 'x')}")


if __name__ == "__main__":
    main()
