"""`plrl profile`: measure the utilisation curve U(h) of this device the paper's way.

For each decode batch h, time the product of a (4096, h + 64) and an (h + 64, 16384) matrix and
count only the useful 2 * 4096 * h * 16384 FLOPs: the 64 padding rows stand for the per-step work
that does not shrink with the batch, which is what makes U(h) proportional to h for small h.
U(h) = useful FLOP/s / peak. On a GPU the product runs in bf16 and peak is the device's nominal
dense bf16 rate when its name is known (else `--peak-tflops`, else the best measured); on a CPU
it runs in fp32 and peak is the best full-product FLOP/s measured. Measurement noise can make U
dip as h grows; the saved curve is made non-decreasing (pool-adjacent-violators), and the raw
values are kept beside it in the file.

Writes a curve JSON that `plrl plan --curve` and `plrl simulate --curve` read.
Neighbours: `plrl_api.utilisation` (the curve format), `plrl_operator.cli` (dispatches the verb).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import time

import torch

from plrl_api import utilisation

# Dense bf16 tensor-core peaks (TFLOP/s) from vendor datasheets; the first name fragment that
# matches the device name wins, so the more specific names come first.
NOMINAL_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.4),
    ("H200", 989.4),
    ("GH200", 989.4),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.05),
    ("L4", 121.0),
)
GPU_HS = (1, 8, 16, 32, 64, 96, 128, 160, 192, 256, 384, 512, 1024, 2048)
CPU_HS = (16, 64, 192)
QUICK_HS = (4, 16, 64)
PAD = 64


def nominal_peak(device_name: str) -> float | None:
    for fragment, tflops in NOMINAL_BF16_TFLOPS:
        if fragment in device_name:
            return tflops
    return None


def time_product(
    h: int, rows: int, cols: int, device: torch.device, dtype: torch.dtype, repeats: int, iters: int
) -> float:
    """Best seconds for one (rows, h + PAD) x (h + PAD, cols) product."""
    a = torch.randn(rows, h + PAD, device=device, dtype=dtype)
    b = torch.randn(h + PAD, cols, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up: kernel selection, allocator
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    out: list[float] = []
    for mean, count in blocks:
        out += [mean] * int(count)
    return out


def profile(
    hs: list[int],
    device: torch.device,
    rows: int,
    cols: int,
    repeats: int,
    peak_tflops: float | None,
    name: str,
    tau: float | None,
) -> utilisation.Curve:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    iters = 20 if device.type == "cuda" else 1
    seconds = [time_product(h, rows, cols, device, dtype, repeats, iters) for h in hs]
    full = [2 * rows * (h + PAD) * cols / t for h, t in zip(hs, seconds, strict=True)]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if peak_tflops is not None:
        peak, source = peak_tflops * 1e12, "--peak-tflops"
    elif device.type == "cuda" and (nominal := nominal_peak(device_name)) is not None:
        peak, source = nominal * 1e12, "nominal dense bf16"
    else:
        peak, source = max(full), "best measured"
    raw = [2 * rows * h * cols / t / peak for h, t in zip(hs, seconds, strict=True)]
    us = [min(1.0, max(u, 1e-6)) for u in monotone(raw)]
    return utilisation.Curve(
        name=name,
        hs=tuple(float(h) for h in hs),
        us=tuple(us),
        tau=tau,
        description=f"measured by plrl profile on {device_name}",
        extra={
            "device": device_name,
            "dtype": str(dtype).removeprefix("torch."),
            "product": f"({rows}, h+{PAD}) x (h+{PAD}, {cols}), useful FLOPs counted with h",
            "peak_tflops": round(peak / 1e12, 3),
            "peak_source": source,
            "raw_u": [round(u, 6) for u in raw],
            "seconds": [float(f"{t:.6g}") for t in seconds],
        },
    )


def _hs(text: str) -> list[int]:
    try:
        hs = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes, got {text!r}") from None
    if not hs or hs[0] < 1:
        raise argparse.ArgumentTypeError("batch sizes must be positive integers")
    return hs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="plrl profile", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument(
        "--out",
        "-o",
        help="curve JSON to write (default: runs/profile/curve-<device>.json; runs/ is git-ignored)",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--h", type=_hs, help="batch sizes to measure (comma-separated)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a seconds-long smoke test of the command (tiny products, three batch sizes): its curve is "
        "noise, not a measurement",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per batch size (best is kept)")
    p.add_argument("--peak-tflops", type=float, help="peak FLOP/s of the device, in TFLOP/s")
    p.add_argument("--tau", type=float, help="training flashes per token to record with the curve")
    p.add_argument("--name", help="curve name (default: from the device)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    problems = []
    if args.repeats < 1:
        problems.append(f"--repeats={args.repeats} must be at least 1")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        problems.append(f"--peak-tflops={args.peak_tflops} must be positive")
    if args.tau is not None and args.tau <= 0:
        problems.append(f"--tau={args.tau} must be positive")
    want = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(want)
    except RuntimeError:
        problems.append(f"--device={args.device!r} is not a torch device")
        device = torch.device("cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        problems.append(f"--device={args.device} but no CUDA device is available")
    if problems:
        print(f"plrl profile: error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    rows, cols = (256, 1024) if args.quick else (4096, 16384)
    hs = args.h or list(QUICK_HS if args.quick else GPU_HS if device.type == "cuda" else CPU_HS)
    label = (
        "cpu"
        if device.type == "cpu"
        else re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower())
    )
    name = args.name or label.strip("-")
    curve = profile(hs, device, rows, cols, args.repeats, args.peak_tflops, name, args.tau)
    out = pathlib.Path(args.out or f"runs/profile/curve-{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(curve.to_json())
    print(f"{'h':>6} {'U(h)':>8} {'raw':>8} {'ms':>9}")
    for h, u, raw, t in zip(curve.hs, curve.us, curve.extra["raw_u"], curve.extra["seconds"], strict=True):
        print(f"{int(h):>6} {u:>8.4f} {raw:>8.4f} {t * 1e3:>9.3f}")
    print(f"peak {curve.extra['peak_tflops']} TFLOP/s ({curve.extra['peak_source']}); curve written to {out}")
    return 0
