"""Decode throughput: the torch engine against transformers `generate` at the same batch H.

For each H, H requests with the same prompt length each decode exactly `--new-tokens` tokens (the
model has no EOS, so neither side stops early): this measures the cost of a decode step, not
continuous batching (`bench/torch_engine.py` measures that). The engine runs with its slots sized
for the largest H and only H of them filled, so its decode batch is H; `generate` gets the same H
rows. Both sample at temperature 1 from the same weights, prefill included, and each (H, method)
is timed `--repeats` times, the two methods alternating; the table shows tokens/s as the median
(min-max) and the ratio of the medians.

Model: `--preset 0.5b` has Qwen2-0.5B's shapes (24 layers, hidden 896, 14 heads, 2 KV heads,
vocab 151,936, 494M parameters) with random weights, built from the config on the device (no
download); `--preset tiny` is a 2-layer toy for CPU smoke runs.

    .venv/bin/python bench/decode_throughput.py --device cuda --dtype bfloat16 --hs 16,64,128,256
    .venv/bin/python bench/decode_throughput.py --preset tiny --hs 4,16 --new-tokens 8   # CPU

`--json FILE` also writes the results (`scripts/gpu-check.sh` reads them).
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import random
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import stats
from plrl_workers.engines import base, factory

PRESETS: dict[str, dict[str, Any]] = {
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
    },
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 1000,
    },
}


def spread(samples: list[float]) -> dict[str, float]:
    """Median and range of repeated measurements (the keys `scripts/gpu-check.sh` reads)."""
    med, lo, hi = stats.median_spread(samples)
    return {"median": med, "min": lo, "max": hi}


def build_model(preset: str, dtype: torch.dtype, device: torch.device, out: pathlib.Path) -> Any:
    """A random-weight Qwen2 of the preset's shapes, saved to `out` (the engine loads from a directory)."""
    import transformers

    cfg = transformers.Qwen2Config(
        **PRESETS[preset],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,  # nothing ends early: every row decodes exactly --new-tokens
        pad_token_id=0,
    )
    torch.manual_seed(0)
    with torch.device(device):  # initialising 0.5B parameters on the GPU takes a fraction of the CPU time
        model = transformers.Qwen2ForCausalLM(cfg).to(dtype)
    model.generation_config.eos_token_id = None
    model.save_pretrained(str(out))
    return model.eval().requires_grad_(False)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_engine(engine: base.GenerationEngine, prompts: list[list[int]], new_tokens: int) -> int:
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, base.SamplingParams(max_new_tokens=new_tokens, temperature=1.0))
    tokens = 0
    while engine.num_in_flight():
        tokens += sum(len(s.token_ids) for s in engine.step())
    return tokens


def run_generate(model: Any, prompts: list[list[int]], new_tokens: int, device: torch.device) -> int:
    ids = torch.tensor(prompts, device=device)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
        eos_token_id=None,
    )
    return int(out[:, ids.shape[1] :].numel())


def timed(fn: Callable[[], int], device: torch.device) -> tuple[int, float]:
    sync(device)
    t0 = time.perf_counter()
    tokens = fn()
    sync(device)
    return tokens, time.perf_counter() - t0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    rng = random.Random(args.seed)
    vocab = int(PRESETS[args.preset]["vocab_size"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model = build_model(args.preset, dtype, device, pathlib.Path(tmp))
        n_params = sum(p.numel() for p in model.parameters())
        engine = factory.generation_engine(
            "torch",
            base.EngineOptions(
                tmp, max(args.hs), args.prompt_len + args.new_tokens, dtype=args.dtype, device=args.device
            ),
        )
        setup_s = time.perf_counter() - t0
        with torch.inference_mode():
            for h in args.hs:
                prompts = [[rng.randrange(1, vocab) for _ in range(args.prompt_len)] for _ in range(h)]
                run_engine(engine, prompts, 2)  # warm-up at this batch shape
                run_generate(model, prompts, 2, device)
                runs: dict[str, Callable[[], int]] = {
                    "engine": functools.partial(run_engine, engine, prompts, args.new_tokens),
                    "generate": functools.partial(run_generate, model, prompts, args.new_tokens, device),
                }
                speeds: dict[str, list[float]] = {name: [] for name in runs}
                for r in range(args.repeats):
                    for name in sorted(runs, reverse=r % 2 == 1):  # alternate which goes first
                        tokens, secs = timed(runs[name], device)
                        if tokens != h * args.new_tokens:
                            raise RuntimeError(f"{name} at H={h} decoded {tokens}, not {h * args.new_tokens}")
                        speeds[name].append(tokens / secs)
                eng, gen = spread(speeds["engine"]), spread(speeds["generate"])
                rows.append(
                    {
                        "h": h,
                        "engine_tok_s": eng,
                        "generate_tok_s": gen,
                        "ratio": eng["median"] / gen["median"],
                    }
                )
        engine.close()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "device": name,
        "dtype": args.dtype,
        "preset": args.preset,
        "parameters": n_params,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "setup_s": round(setup_s, 2),
        "rows": rows,
    }


def format_table(result: dict[str, Any]) -> str:
    r = result
    lines = [
        f"decode throughput on {r['device']}, {r['dtype']}, {r['parameters'] / 1e6:.3g}M-parameter model "
        f"({r['preset']}), prompt {r['prompt_len']} + {r['new_tokens']} new tokens, "
        f"tokens/s median of {r['repeats']} (min-max)",
        f"{'H':>5}  {'torch engine':>26}  {'transformers generate':>26}  {'ratio':>6}",
    ]

    def cell(s: dict[str, float]) -> str:
        return f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"

    for row in result["rows"]:
        lines.append(
            f"{row['h']:>5}  {cell(row['engine_tok_s']):>26}  {cell(row['generate_tok_s']):>26}  "
            f"{row['ratio']:>5.2f}x"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="0.5b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--hs", default="16,64,128,256", help="comma-separated batch sizes H")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=pathlib.Path, help="also write the results here")
    args = ap.parse_args()
    args.hs = sorted({int(h) for h in args.hs.split(",") if h.strip()})
    if args.repeats < 1 or not args.hs or args.hs[0] < 1:
        ap.error("--repeats and every H must be at least 1")
    result = measure(args)
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
