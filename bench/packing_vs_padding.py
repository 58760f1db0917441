"""Dynamic packing vs padding: one optimizer step over the same variable-length batch, trained both ways.

Checks the design-notes claim "for sequences of L = 1024, dynamic packing reduces memory by 37% and
raises throughput by 22%". The batch is `--sequences` sequences whose lengths (prompt + completion)
are drawn from [--min-len, --max-len] (uniform or log-uniform, fixed seed); each sequence has
`--prompt-tokens` prompt tokens, the rest is completion. Both ways run forward + backward over every
micro-batch, then one `torch.optim.AdamW` step, with the runtime's loss (`--loss`, per completion
token, normalised by the batch's completion tokens) on the same model:

- packed: `rl.packing.plan` lays whole sequences back to back in rows of at most
  `--tokens-per-micro-batch` tokens with position ids restarting per sequence, and `rl.step.rl_step`
  (the runtime's own forward, `use_cache=False`, and loss) trains each row; no padding.
- padded: the conventional way: micro-batches of `--sequences-per-micro-batch` sequences in batch
  order (default: as many as hold about `--tokens-per-micro-batch` real tokens on average), each
  right-padded to its longest sequence, with an attention mask; the same loss, pads masked out.
  `--group-by-length` sorts the sequences by length first (like transformers' `group_by_length`), the
  strongest padding baseline: it pads least, at the price of batches that are not random samples.

Before timing, the two batch losses are computed under the same weights and printed: they must agree
(same sequences, same loss), or the comparison is void. After one untimed warm-up step of each (it
also creates AdamW's state), every repeat times one step of each, their order swapped every other
repeat so load drift hits both alike. Per step: seconds; trained tokens/s = completion tokens /
seconds; peak memory above the memory in use just before the step. On CUDA that is
`torch.cuda.max_memory_allocated`; on CPU the resident set size (RSS), read by a background thread
every `--sample-ms` and, where Linux lets the process reset it (/proc/self/clear_refs), also the
kernel's exact high-water mark VmHWM (the sampler can miss a peak shorter than its interval). Before
each CPU step freed heap memory is handed back to the OS (glibc `malloc_trim`), so memory left over
by the previous step is not reused uncounted. It prints per-repeat lines, then median (min-max) over
repeats, and the headline ratios as the median (min-max) of per-repeat ratios.

Fairness on CPU: sdpa over a packed row computes the dense T x T score product and masks it to block
diagonal (see bench/packed_micro_batches.py), whereas flash-attention on GPU (varlen) costs only the
diagonal blocks; a padded micro-batch of B rows of width W costs B x W x W. So on CPU packing pays
for attention between sequences that never see each other, more the longer its rows: the table
shows the attention scores each way computes. Linear layers and logits, by contrast, cost per
computed token, and there padding pays for its pad tokens. The default rows of 2048 tokens (twice
L) against padded micro-batches holding about as many real tokens keep the dense-attention penalty
small; rows of 4096 (`--tokens-per-micro-batch 4096`) more than double packing's attention scores
and, with this small model (hidden 256, where attention is a large share of the work), make packing
slower on CPU although it still uses less memory. A real LLM with a real vocabulary spends far more
per computed token, so there padding costs more than here.

    OMP_NUM_THREADS=1 .venv/bin/python bench/packing_vs_padding.py   # the defaults: 2-3 minutes on 2 cores
    OMP_NUM_THREADS=1 .venv/bin/python bench/packing_vs_padding.py --lengths log-uniform \
        --tokens-per-micro-batch 4096 --group-by-length --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import math
import pathlib
import re
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import numpy
import psutil
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import stats
from plrl_workers.models import tiny
from plrl_workers.rl import losses, packing, step

PACKED, PADDED = "packed", "padded"
MIB = 2**20


@dataclasses.dataclass
class PaddedBatch:
    """B sequences right-padded to the longest: inputs [B, W]; per-token data [B * W], aligned to
    targets as in `packing.MicroBatch`, zero (and out of the loss mask) on pad positions."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target_ids: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    batch_tokens: int

    def to(self, device: torch.device) -> PaddedBatch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)


def make_sequences(
    n: int, min_len: int, max_len: int, prompt: int, dist: str, vocab: int, seed: int
) -> list[packing.TrainSequence]:
    rng = numpy.random.default_rng(seed)
    if dist == "uniform":
        lengths = rng.integers(min_len, max_len, endpoint=True, size=n)
    else:
        lengths = numpy.exp(rng.uniform(math.log(min_len), math.log(max_len + 1), size=n)).astype(int)
    out = []
    for length in numpy.clip(lengths, min_len, max_len):
        completion = int(length) - prompt
        out.append(
            packing.TrainSequence(
                prompt_ids=rng.integers(4, vocab, size=prompt),
                completion_ids=rng.integers(4, vocab, size=completion),
                # Near what an untrained model gives (uniform over the vocabulary), so the truncated
                # importance weights stay near 1 as in on-policy training.
                behaviour_logprobs=numpy.full(completion, -math.log(vocab), numpy.float32),
                versions=numpy.zeros(completion, numpy.int64),
                advantage=float(rng.choice([-1.0, 1.0])),
            )
        )
    return out


def _right_pad(parts: list[torch.Tensor], fill: float) -> torch.Tensor:
    """[len(parts), longest] with each 1-D part at the start of its row and `fill` after it."""
    out = torch.full((len(parts), max(len(p) for p in parts)), fill, dtype=parts[0].dtype)
    for i, p in enumerate(parts):
        out[i, : len(p)] = p
    return out


def pad_batches(seqs: list[packing.TrainSequence], per_mb: int, pad_id: int) -> list[PaddedBatch]:
    """Consecutive groups of `per_mb` sequences, each right-padded to its longest member."""
    batch_tokens = sum(len(s.completion_ids) for s in seqs)
    out = []
    for start in range(0, len(seqs), per_mb):
        # One-sequence collates give exactly the runtime's per-token alignment; padding only appends.
        rows = [packing.collate([s], batch_tokens) for s in seqs[start : start + per_mb]]
        out.append(
            PaddedBatch(
                input_ids=_right_pad([r.input_ids[0] for r in rows], pad_id),
                attention_mask=_right_pad([torch.ones_like(r.input_ids[0]) for r in rows], 0),
                target_ids=_right_pad([r.target_ids for r in rows], 0).flatten(),
                loss_mask=_right_pad([r.loss_mask for r in rows], False).flatten(),
                behaviour_logprobs=_right_pad([r.behaviour_logprobs for r in rows], 0.0).flatten(),
                advantages=_right_pad([r.advantages for r in rows], 0.0).flatten(),
                weights=_right_pad([r.weights for r in rows], 0.0).flatten(),
                batch_tokens=batch_tokens,
            )
        )
    return out


def padded_loss(model: torch.nn.Module, pb: PaddedBatch, cfg: step.RLConfig) -> torch.Tensor:
    """`step.rl_step`'s computation on a padded batch: same log-probabilities, same registered loss."""
    out = model(input_ids=pb.input_ids, attention_mask=pb.attention_mask, use_cache=False)
    logprobs = step.sampled_logprobs(out.logits.flatten(0, 1), pb.target_ids, cfg.temperature)
    inputs = losses.LossInputs(
        logprobs=logprobs,
        behaviour_logprobs=pb.behaviour_logprobs,
        advantages=pb.advantages,
        weights=pb.weights,
        loss_mask=pb.loss_mask,
        normalizer=float(pb.batch_tokens),
    )
    loss, _ = losses.get(cfg.loss.name)(inputs, cfg.loss)
    return loss


def packed_losses(
    model: torch.nn.Module, mbs: list[packing.MicroBatch], cfg: step.RLConfig, device: torch.device
) -> Iterator[torch.Tensor]:
    for mb in mbs:
        yield step.rl_step(model, mb.to(device), cfg)[0]


def padded_losses(
    model: torch.nn.Module, pbs: list[PaddedBatch], cfg: step.RLConfig, device: torch.device
) -> Iterator[torch.Tensor]:
    for pb in pbs:
        yield padded_loss(model, pb.to(device), cfg)


def train_step(losses_of_batch: Iterator[torch.Tensor], opt: torch.optim.Optimizer) -> None:
    for loss in losses_of_batch:
        loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    opt.zero_grad(set_to_none=True)


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to hand back this way
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _vm_hwm() -> int | None:
    """The kernel's peak RSS of this process in bytes, or None where /proc does not report it."""
    try:
        found = re.search(r"VmHWM:\s+(\d+) kB", pathlib.Path("/proc/self/status").read_text())
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def _reset_vm_hwm() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclasses.dataclass
class Peak:
    """Peak memory of one step above what was in use just before it, in bytes."""

    sampled: float
    """CUDA: max_memory_allocated; CPU: the background sampler's max RSS."""
    hwm: float | None = None
    """CPU only: the kernel's high-water mark, where it could be reset before the step."""


def measure(device: torch.device, sample_s: float, fn: Callable[[], None]) -> tuple[float, Peak]:
    """(seconds, peak memory) of `fn()`, the memory relative to what was in use just before."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        return seconds, Peak(float(torch.cuda.max_memory_allocated(device) - base))
    _malloc_trim()
    proc = psutil.Process()
    base = proc.memory_info().rss
    hwm_ok = _reset_vm_hwm()
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(sample_s):
            peak = max(peak, proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    peak = max(peak, proc.memory_info().rss)
    hwm = _vm_hwm() if hwm_ok else None
    return seconds, Peak(float(peak - base), None if hwm is None else float(hwm - base))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=24, help="sequences in the optimizer batch")
    ap.add_argument("--min-len", type=int, default=64, help="shortest sequence (prompt + completion)")
    ap.add_argument("--max-len", type=int, default=1024, help="longest sequence: the claim's L")
    ap.add_argument("--lengths", choices=["uniform", "log-uniform"], default="uniform")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt tokens of every sequence")
    ap.add_argument(
        "--tokens-per-micro-batch", type=int, default=2048, help="packed row capacity (see the docstring)"
    )
    ap.add_argument(
        "--sequences-per-micro-batch",
        type=int,
        default=0,
        help="padded micro-batch size; 0: tokens-per-micro-batch / mean length, rounded",
    )
    ap.add_argument(
        "--group-by-length", action="store_true", help="padded: sort sequences by length before batching"
    )
    ap.add_argument("--loss", default="reinforce_tis", choices=sorted(losses.REGISTRY))
    ap.add_argument("--hidden", type=int, default=256, help="model width (head_dim stays 64)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timed steps of each, alternated")
    ap.add_argument("--sample-ms", type=float, default=1.0, help="CPU RSS sampling interval")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if not 0 < args.prompt_tokens < args.min_len <= args.max_len <= args.tokens_per_micro_batch:
        ap.error("need 0 < --prompt-tokens < --min-len <= --max-len <= --tokens-per-micro-batch")
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )

    torch.manual_seed(args.seed)
    heads = args.hidden // 64
    model_cfg = tiny.TinyModelConfig(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=args.max_len,
    )
    with tempfile.TemporaryDirectory() as tmp:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(tiny.build(tmp, model_cfg, seed=args.seed)), attn_implementation="sdpa", dtype=torch.float32
        )
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    cfg = step.RLConfig(
        loss=losses.LossConfig(name=args.loss), tokens_per_micro_batch=args.tokens_per_micro_batch
    )

    vocab = len(tiny.vocabulary())
    seqs = make_sequences(
        args.sequences, args.min_len, args.max_len, args.prompt_tokens, args.lengths, vocab, args.seed
    )
    lengths = [len(s) for s in seqs]
    completion_tokens = sum(len(s.completion_ids) for s in seqs)
    per_mb = args.sequences_per_micro_batch or max(
        1, round(args.tokens_per_micro_batch / statistics.mean(lengths))
    )
    packed = packing.plan(seqs, 1, args.tokens_per_micro_batch)[0]
    in_order = sorted(seqs, key=len, reverse=True) if args.group_by_length else seqs
    padded = pad_batches(in_order, per_mb, tiny.vocabulary()[tiny.PAD])
    # Per micro-batch: computed positions and attention scores (per head and layer) the dense kernel forms.
    shape: dict[str, list[tuple[int, int]]] = {
        PACKED: [(1, mb.num_tokens) for mb in packed],
        PADDED: [(int(pb.input_ids.shape[0]), int(pb.input_ids.shape[1])) for pb in padded],
    }
    computed = {k: sum(b * w for b, w in v) for k, v in shape.items()}
    scores = {k: sum(b * w * w for b, w in v) for k, v in shape.items()}
    real = sum(lengths)

    steps: dict[str, Callable[[], None]] = {
        PACKED: lambda: train_step(packed_losses(model, packed, cfg, device), opt),
        PADDED: lambda: train_step(padded_losses(model, padded, cfg, device), opt),
    }
    with torch.no_grad():
        check = {
            PACKED: sum(float(x) for x in packed_losses(model, packed, cfg, device)),
            PADDED: sum(float(x) for x in padded_losses(model, padded, cfg, device)),
        }
    print(
        f"batch loss under the same weights: packed {check[PACKED]:.6f}, padded {check[PADDED]:.6f} "
        f"(|diff| {abs(check[PACKED] - check[PADDED]):.1e})",
        flush=True,
    )
    if not math.isclose(check[PACKED], check[PADDED], rel_tol=1e-4, abs_tol=1e-5):
        print("the two ways do not compute the same loss; the comparison is void", file=sys.stderr)
        return 1
    for fn in steps.values():  # warm-up; also creates AdamW's state, so both steps find it
        measure(device, args.sample_ms / 1000, fn)

    secs: dict[str, list[float]] = {k: [] for k in steps}
    mem: dict[str, list[float]] = {k: [] for k in steps}
    hwm: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(args.repeats):
        for name in [PACKED, PADDED] if r % 2 == 0 else [PADDED, PACKED]:
            seconds, peak = measure(device, args.sample_ms / 1000, steps[name])
            secs[name].append(seconds)
            mem[name].append(peak.sampled)
            if peak.hwm is not None:
                hwm[name].append(peak.hwm)
            also = "" if peak.hwm is None else f", VmHWM +{peak.hwm / MIB:.0f} MiB"
            print(
                f"repeat {r + 1} {name}: {seconds:.2f} s, {completion_tokens / seconds:.0f} trained tok/s, "
                f"peak +{peak.sampled / MIB:.0f} MiB{also}",
                flush=True,
            )

    grouped = " grouped by length" if args.group_by_length else ""
    mem_kind = "max_memory_allocated" if device.type == "cuda" else f"RSS sampled every {args.sample_ms:g} ms"
    print(
        f"{args.sequences} sequences of {args.min_len}-{args.max_len} tokens ({args.lengths}, mean "
        f"{statistics.mean(lengths):.0f}, {args.prompt_tokens} prompt tokens each): {real} tokens, "
        f"{completion_tokens} trained (completion) tokens; loss {args.loss}; model hidden {args.hidden} x "
        f"{args.layers} layers, sdpa, {device}, torch threads {torch.get_num_threads()}"
    )
    print(
        f"packed: {len(packed)} rows of <= {args.tokens_per_micro_batch} tokens; padded: {len(padded)} "
        f"micro-batches of {per_mb} sequences{grouped}; median (min-max) of {args.repeats} repeats; "
        f"peak memory = {mem_kind}, above the step's start"
    )
    head = (
        f"  {'':8s} {'micro-batches':>13s} {'computed tokens':>15s} {'of them pad':>11s} {'attn scores':>12s}"
    )
    print(f"{head} {'s/step':>20s} {'trained tok/s':>22s} {'peak MiB':>20s}")
    for name in steps:
        tok_s = [completion_tokens / s for s in secs[name]]
        print(
            f"  {name:8s} {len(shape[name]):>13d} {computed[name]:>15d} {computed[name] - real:>11d} "
            f"{scores[name] / 1e6:>11.1f}M {stats.fmt_spread(secs[name], '.2f'):>20s} "
            f"{stats.fmt_spread(tok_s, '.0f'):>22s} {stats.fmt_spread(mem[name], '.0f', scale=1 / MIB):>20s}"
        )
    mem_ratio = stats.ratios(mem[PADDED], mem[PACKED])
    saved = [1 - 1 / x for x in mem_ratio]
    speed = stats.ratios(secs[PADDED], secs[PACKED])  # = packed / padded tokens/s: same tokens both ways
    print(f"  peak memory padded / packed: {stats.fmt_spread(mem_ratio, '.2f', 'x')}")
    print(f"  memory saved by packing: {stats.fmt_spread(saved, '.0f', '%', scale=100)}")
    if len(hwm[PACKED]) == len(hwm[PADDED]) == args.repeats:
        hwm_ratio = stats.ratios(hwm[PADDED], hwm[PACKED])
        hwm_saved = [1 - 1 / x for x in hwm_ratio]
        print(
            f"    cross-check with VmHWM: padded / packed {stats.fmt_spread(hwm_ratio, '.2f', 'x')}, "
            f"saved {stats.fmt_spread(hwm_saved, '.0f', '%', scale=100)}"
        )
    print(f"  trained tokens/s packed / padded: {stats.fmt_spread(speed, '.2f', 'x')}")
    print("  claim (design notes, L = 1024): memory saved 37%, throughput 1.22x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
