"""Fixtures for the trainer tests: the tiny model, and a launcher that runs `_worker.py` as N real
ranks (separate processes, gloo over loopback, a free port), one thread per rank; CPU only unless
`devices` names GPUs (test_cuda.py)."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import pytest

from plrl_workers.models import tiny

WORKER = pathlib.Path(__file__).with_name("_worker.py")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tiny.build(tmp_path_factory.mktemp("tiny-model"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def launch_ranks(world_size: int, args: list[str], timeout: float = 600.0, devices: str = "") -> None:
    """Run the worker as `world_size` ranks; raise with every rank's output tail if one fails.

    `devices` is every rank's CUDA_VISIBLE_DEVICES ("": CPU, gloo; else NCCL on cuda:LOCAL_RANK)."""
    port = _free_port()
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=devices, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        where = ["--port", str(port), "--rank", str(rank), "--world-size", str(world_size)]
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), *where, *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs, failed = [], False
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            failed = True
        outputs.append(f"--- rank {rank} (rc={p.returncode})\n{out[-4000:]}")
        failed = failed or p.returncode != 0
    if failed:
        raise AssertionError("worker ranks failed:\n" + "\n".join(outputs))


# One 2-rank launch serves the test files (and one 1-rank launch those that need one): starting ranks
# (importing torch, transformers and DeepSpeed) costs far more than the few steps each scenario trains.
TWO_RANK_TRAIN_RUNS = ("torch", "zero1", "zero2", "torch-clip", "zero1-clip")
CHECKPOINT_RUNS = ("torch", "zero2")
ELASTIC_RUNS = ("torch", "zero1", "zero2")


def elastic_roots(out: pathlib.Path, world_size: int) -> str:
    """The `--elastic-load` argument for the checkpoints `--elastic-save` wrote into `out`."""
    return ",".join(str(out / f"elastic.{run}.w{world_size}") for run in ELASTIC_RUNS)


@pytest.fixture(scope="session")
def two_ranks(tiny_model_dir: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Trained runs (`<run>.rank<r>.pt`), the first checkpoint phase and the elastic checkpoints
    (`elastic.<run>.w2`), from one set of 2 ranks."""
    out = tmp_path_factory.mktemp("two-ranks")
    launch_ranks(
        2,
        [
            *("--model", str(tiny_model_dir), "--out", str(out)),
            *("--train", ",".join(TWO_RANK_TRAIN_RUNS), "--checkpoint", ",".join(CHECKPOINT_RUNS)),
            *("--elastic-save", ",".join(ELASTIC_RUNS)),
        ],
    )
    return out


@pytest.fixture(scope="session")
def one_rank(
    tiny_model_dir: pathlib.Path, two_ranks: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> pathlib.Path:
    """Trained runs at 1 rank, the elastic checkpoints `elastic.<run>.w1`, and `two_ranks`' elastic
    checkpoints loaded at 1 rank (`elastic.<run>.w2.to1.pt`)."""
    out = tmp_path_factory.mktemp("one-rank")
    launch_ranks(
        1,
        [
            *("--model", str(tiny_model_dir), "--out", str(out), "--train", "torch,zero2"),
            *("--elastic-save", ",".join(ELASTIC_RUNS), "--elastic-load", elastic_roots(two_ranks, 2)),
        ],
    )
    return out
