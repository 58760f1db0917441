"""The training backends on one CUDA GPU (the `gpu` marker; `scripts/gpu-check.sh` runs these).

Cases: torch DDP on CUDA in fp32 reaches the parameters DDP reaches on the CPU after the same
batches; DDP in bf16 (autocast over fp32 master weights) follows the fp32 run: the same losses to
about a percent and parameter updates pointing the same way; DeepSpeed ZeRO-1 and ZeRO-2 on CUDA
match DDP on CUDA in fp32 and follow it in bf16 (DeepSpeed's bf16 mode keeps bf16 parameters) —
skipped, saying why, where DeepSpeed cannot be imported.

One rank per launch: NCCL refuses two ranks on one GPU, and 1 vs 2 ranks is covered on the CPU
(test_backends.py). Tolerances: CUDA and CPU fp32 differ only in summation order, which Adam with
eps=1e-4 (see `_worker.py`) turns into parameter differences far below 1e-5 on updates of ~3e-3.
The bf16 bounds were measured on the CPU (autocast bf16: cosine 0.99994, losses within 1e-4).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
from typing import Any

import pytest
import torch

from tests.workers.engines.training import conftest

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TOL = 1e-5
STEPS = 3
HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
NO_DEEPSPEED = "DeepSpeed is not installed here (scripts/gpu-check.sh carries its wheel: --fetch)"


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch's output directory, and its error if a rank failed (runs saved before it stay)."""

    out: pathlib.Path
    error: str | None

    def load(self, run: str) -> dict[str, Any]:
        path = self.out / f"{run}.rank0.pt"
        if not path.exists():
            pytest.fail(f"no result for {run}: {self.error or 'the launch wrote none'}")
        result: dict[str, Any] = torch.load(path, weights_only=False)
        return result


def _launch(model: pathlib.Path, out: pathlib.Path, runs: list[str], dtype: str, devices: str) -> Launch:
    args = ["--model", str(model), "--out", str(out), "--train", ",".join(runs), "--steps", str(STEPS)]
    try:
        conftest.launch_ranks(1, [*args, "--dtype", dtype], devices=devices)
    except AssertionError as err:  # DeepSpeed failing must not hide the DDP results before it
        return Launch(out, str(err))
    return Launch(out, None)


RUNS = ["torch", *(["zero1", "zero2"] if HAVE_DEEPSPEED else [])]


@pytest.fixture(scope="module")
def cpu_fp32(tiny_model_dir: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    return _launch(tiny_model_dir, tmp_path_factory.mktemp("cpu-fp32"), ["torch"], "float32", "")


@pytest.fixture(scope="module")
def cuda_fp32(tiny_model_dir: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    return _launch(tiny_model_dir, tmp_path_factory.mktemp("cuda-fp32"), RUNS, "float32", "0")


@pytest.fixture(scope="module")
def cuda_bf16(tiny_model_dir: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    return _launch(tiny_model_dir, tmp_path_factory.mktemp("cuda-bf16"), RUNS, "bfloat16", "0")


def _update(result: dict[str, Any], initial: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([(result["params"][n] - initial[n]).flatten() for n in sorted(initial)])


def _initial(model: pathlib.Path) -> dict[str, torch.Tensor]:
    import safetensors.torch

    weights: dict[str, torch.Tensor] = safetensors.torch.load_file(str(model / "model.safetensors"))
    return weights


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a["params"].keys() == b["params"].keys()
    return max(float((a["params"][n] - b["params"][n]).abs().max()) for n in a["params"])


def _assert_follows(
    run: dict[str, Any], fp32: dict[str, Any], initial: dict[str, torch.Tensor], cos: float
) -> None:
    """A lower-precision run takes the fp32 run's steps: close losses, updates in the same direction."""
    for a, b in zip(run["metrics"], fp32["metrics"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=0.02, abs=0.01)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=0.05)
    got = torch.nn.functional.cosine_similarity(_update(run, initial), _update(fp32, initial), dim=0)
    assert float(got) > cos, f"bf16 updates diverge from fp32 (cosine {float(got):.4f})"


def test_ddp_on_cuda_reaches_the_cpu_parameters_in_fp32(
    cpu_fp32: Launch, cuda_fp32: Launch, tiny_model_dir: pathlib.Path
) -> None:
    gpu, cpu = cuda_fp32.load("torch"), cpu_fp32.load("torch")
    moved = float(_update(gpu, _initial(tiny_model_dir)).abs().max())
    assert moved > 100 * TOL, "training did not move the weights"
    assert _max_diff(gpu, cpu) <= TOL
    for a, b in zip(gpu["metrics"], cpu["metrics"], strict=True):
        for key in ("loss", "grad_norm", "ess", "trained_tokens"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_ddp_in_bf16_on_cuda_follows_fp32(
    cuda_fp32: Launch, cuda_bf16: Launch, tiny_model_dir: pathlib.Path
) -> None:
    _assert_follows(cuda_bf16.load("torch"), cuda_fp32.load("torch"), _initial(tiny_model_dir), cos=0.99)


@pytest.mark.skipif(not HAVE_DEEPSPEED, reason=NO_DEEPSPEED)
@pytest.mark.parametrize("run", ["zero1", "zero2"])
def test_deepspeed_zero_on_cuda_matches_ddp_in_fp32(cuda_fp32: Launch, run: str) -> None:
    assert _max_diff(cuda_fp32.load(run), cuda_fp32.load("torch")) <= TOL


@pytest.mark.skipif(not HAVE_DEEPSPEED, reason=NO_DEEPSPEED)
@pytest.mark.parametrize("run", ["zero1", "zero2"])
def test_deepspeed_zero_in_bf16_on_cuda_follows_fp32(
    cuda_fp32: Launch, cuda_bf16: Launch, tiny_model_dir: pathlib.Path, run: str
) -> None:
    # Looser than DDP's: DeepSpeed's bf16 mode also stores the parameters (not only the compute) in bf16.
    _assert_follows(cuda_bf16.load(run), cuda_fp32.load("torch"), _initial(tiny_model_dir), cos=0.95)
