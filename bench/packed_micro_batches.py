"""Trainer micro-batch size on CPU: one optimizer step over the same packed batch, cut differently.

Packing puts many sequences in one row and restarts position ids per sequence; transformers turns
that into a block-diagonal causal mask. With flash-attention (GPU) the cost is linear in the packed
length T, but CPU attention (sdpa/eager) computes the dense T x T product and masks it, so cost grows
with T^2 and smaller micro-batches win despite more calls. Each repeat times one optimizer step
per `tokensPerMicroBatch`, the sizes in turn (their order reversed every other repeat, so a load
change hits all alike); it prints seconds per step and the speed-up over the first size, each as
the median (min-max) over repeats, the speed-up from per-repeat ratios.

    .venv/bin/python bench/packed_micro_batches.py [--batch-tokens 2048 --sizes 4096,1024,512,256 --repeats 5]
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys
import tempfile
import time

import torch
import transformers

from plrl_workers.models import tiny

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench import stats  # after the path insert: run as a script from the repo root


def step_seconds(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch_tokens: int,
    seq_len: int,
    micro_tokens: int,
) -> float:
    per_mb = max(seq_len, min(batch_tokens, micro_tokens) // seq_len * seq_len)  # whole sequences only
    n_mb = -(-batch_tokens // per_mb)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40, (1, per_mb), generator=gen)
    pos = torch.arange(seq_len).repeat(per_mb // seq_len)[None]
    t0 = time.perf_counter()
    for _ in range(n_mb):
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        torch.logsumexp(logits.float(), dim=-1).mean().backward()  # type: ignore[no-untyped-call]
    opt.step()
    opt.zero_grad()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-tokens", type=int, default=2048, help="tokens in one optimizer batch")
    ap.add_argument("--seq-len", type=int, default=20, help="tokens per packed sequence")
    ap.add_argument("--sizes", default="4096,1024,512,256", help="tokensPerMicroBatch values")
    ap.add_argument("--repeats", type=int, default=5, help="alternated steps per size")
    args = ap.parse_args()
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(tiny.build(tmp)), attn_implementation="sdpa"
        )
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    sizes = [int(s) for s in args.sizes.split(",")]
    step_seconds(model, opt, args.batch_tokens, args.seq_len, sizes[-1])  # warm-up
    times: dict[int, list[float]] = {s: [] for s in sizes}
    for r in range(args.repeats):
        for s in sizes if r % 2 == 0 else reversed(sizes):
            times[s].append(step_seconds(model, opt, args.batch_tokens, args.seq_len, s))
    print(f"{'tokensPerMicroBatch':>20}  {'s/step':<22}speed-up over {sizes[0]}")
    for s, ts in times.items():
        speed_up = stats.fmt_spread(stats.ratios(times[sizes[0]], ts), ".2f", "x")
        print(f"{s:>20}  {stats.fmt_spread(ts, '.3f'):<22}{speed_up}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
