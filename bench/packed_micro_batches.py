"""Trainer micro-batch size on CPU: one optimizer step over the same packed batch, cut differently.

Packing puts many sequences in one row and restarts position ids per sequence; transformers turns
that into a block-diagonal causal mask. With flash-attention (GPU) the cost is linear in the packed
length T, but CPU attention (sdpa/eager) computes the dense T x T product and masks it, so cost grows
with T^2 and smaller micro-batches win despite more calls. This prints seconds per optimizer step
for each `tokensPerMicroBatch`, side by side, and the speed-up over the largest.

    .venv/bin/python bench/packed_micro_batches.py [--batch-tokens 2048 --sizes 4096,1024,512,256]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import transformers

from plrl_workers.models import tiny


def step_seconds(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch_tokens: int,
    seq_len: int,
    micro_tokens: int,
    repeats: int,
) -> float:
    per_mb = max(seq_len, min(batch_tokens, micro_tokens) // seq_len * seq_len)  # whole sequences only
    n_mb = -(-batch_tokens // per_mb)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40, (1, per_mb), generator=gen)
    pos = torch.arange(seq_len).repeat(per_mb // seq_len)[None]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n_mb):
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
            torch.logsumexp(logits.float(), dim=-1).mean().backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-tokens", type=int, default=2048, help="tokens in one optimizer batch")
    ap.add_argument("--seq-len", type=int, default=20, help="tokens per packed sequence")
    ap.add_argument("--sizes", default="4096,1024,512,256", help="tokensPerMicroBatch values")
    ap.add_argument("--repeats", type=int, default=5, help="best of this many steps per size")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(tiny.build(tmp)), attn_implementation="sdpa"
        )
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    sizes = [int(s) for s in args.sizes.split(",")]
    step_seconds(model, opt, args.batch_tokens, args.seq_len, sizes[-1], 1)  # warm-up
    times = {s: step_seconds(model, opt, args.batch_tokens, args.seq_len, s, args.repeats) for s in sizes}
    print(f"{'tokensPerMicroBatch':>20}{'s/step':>9}{'speed-up':>10}")
    for s, t in times.items():
        print(f"{s:>20}{t:>9.3f}{times[sizes[0]] / t:>9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
