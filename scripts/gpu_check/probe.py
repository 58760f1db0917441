"""The gpu-check's `env` stage, run in the interpreter under test: what is there, and does it import.

Writes one JSON document (`--out`): Python and torch versions, the CUDA device (name, capability,
memory), the versions of the packages the check relies on (read from their metadata, so DeepSpeed
is not imported just to be counted), whether every module on the GPU-check path imports, whether
that pulled in a package the GPU machine's image lacks (kopf, kubernetes, vLLM: none may be
needed), and where the built-in utilisation curves are (for the H100 curve's tau).

Run as `python -m scripts.gpu_check.probe --out FILE` with the check's PYTHONPATH. Neighbours:
`stages.py` (the env stage runs it), `collect.py` (`env_result` judges its output).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import pathlib
import platform
import sys
import traceback
from typing import Any

# The modules `plrl run`, `plrl profile`, `plrl plan`, the engines and the GPU tests import.
MODULES = (
    "plrl_operator.cli",
    "plrl_operator.local.runner",
    "plrl_workers.__main__",
    "plrl_workers.prepare",
    "plrl_workers.generator",
    "plrl_workers.trainer",
    "plrl_workers.profiler",
    "plrl_workers.engines.torch_engine",
    "plrl_workers.engines.ddp_engine",
    "plrl_workers.weight_sync.sender",
    "plrl_workers.rpc.server",
    "plrl_operator.plan_cli",
)
# Where the utilisation module lives (the first that imports wins; it may move packages).
UTILISATION_MODULES = ("plrl_api.utilisation",)
DISTRIBUTIONS = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "pydantic",
    "pydantic-core",
    "typing-extensions",
    "grpcio",
    "protobuf",
    "PyYAML",
    "psutil",
    "prometheus-client",
    "matplotlib",
    "pytest",
    "pytest-timeout",
    "deepspeed",
    "hjson",
)
MUST_BE_ABSENT = ("kopf", "kubernetes", "vllm")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe() -> dict[str, Any]:
    import torch

    doc: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "device": None,
        "packages": {d: _version(d) for d in DISTRIBUTIONS},
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        doc["device"] = torch.cuda.get_device_name(0)
        doc["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        doc["memory_gib"] = round(props.total_memory / 2**30, 1)
        doc["bf16_supported"] = torch.cuda.is_bf16_supported()
    errors = {}
    for m in MODULES:
        try:
            importlib.import_module(m)
        except Exception:
            errors[m] = traceback.format_exc(limit=3).strip().splitlines()[-1]
    doc["import_errors"] = errors
    doc["absent_but_loaded"] = sorted(m for m in MUST_BE_ABSENT if sys.modules.get(m) is not None)
    for name in UTILISATION_MODULES:
        try:
            utilisation = importlib.import_module(name)
        except ImportError:
            continue
        curves = pathlib.Path(utilisation.CURVES_DIR)
        doc["curves_dir"] = str(curves)
        doc["h100_tau"] = json.loads((curves / "h100.json").read_text()).get("tau")
        break
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m scripts.gpu_check.probe")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    args = ap.parse_args()
    doc = probe()
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "packages"}, indent=2))


if __name__ == "__main__":
    main()
