"""Torch engine: continuous batching vs transformers `generate`, same batch, variable-length outputs.

Every request has its own output budget (uniform in [min_new, max_new]) and may also end at EOS.
`generate` decodes each batch of B requests until its longest member is done (it cannot stop one
row early for its own budget, so short rows ride along); the engine keeps B slots busy and refills
a slot in the step its sequence ends. Both sample at temperature 1 from the same weights and
count only useful tokens (each sequence up to its budget or first EOS). One run prints both,
side by side, and the ratio.

    .venv/bin/python bench/torch_engine.py [--requests 64 --batch 16 --hidden 256 --layers 4 ...]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from plrl_workers.engines import base, factory
from plrl_workers.models import tiny

if TYPE_CHECKING:
    import transformers


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
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (on a contended CPU more threads spin and slow down)",
    )
    args = ap.parse_args()
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
            rows = []
            runs: tuple[tuple[str, Callable[[], int]], ...] = (
                ("transformers generate", lambda: run_generate(model, reqs, args.batch, eos)),
                ("torch engine (continuous)", lambda: run_engine(engine, reqs, eos)),
            )
            for name, fn in runs:
                t0 = time.perf_counter()
                tokens = fn()
                rows.append((name, tokens, time.perf_counter() - t0))
        engine.close()

    print(
        f"{args.requests} requests, batch/slots {args.batch}, budgets {args.min_new}-{args.max_new} tokens, "
        f"model hidden {args.hidden} x {args.layers} layers, {args.device}, "
        f"torch threads {torch.get_num_threads()}"
    )
    for name, tokens, secs in rows:
        print(f"  {name:28s} {tokens:7d} tokens {secs:8.2f} s {tokens / secs:9.1f} tok/s")
    (_, t_gen, s_gen), (_, t_eng, s_eng) = rows
    print(f"  ratio engine / generate: {(t_eng / s_eng) / (t_gen / s_gen):.2f}x tokens/s")


if __name__ == "__main__":
    main()
