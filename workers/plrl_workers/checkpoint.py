"""Trainer checkpoints: save every K steps, keep the last `keep`, find the latest, resume.

Layout of `<root>/step-00000042/`:
- `model/`: the weights in Hugging Face format plus the tokenizer files, so a generator (vLLM or
  the torch engine) can load the directory as a model;
- the backend's own state (`optimizer.pt` for DDP; `deepspeed/` with per-rank ZeRO partitions);
- `engine.json` (backend, version, world size; for DeepSpeed also the ZeRO stage, tag and partition
  files), `rng/rank<r>.pt` (torch, CUDA and Python RNG state of every rank), and `meta.json`: step,
  version, and an opaque JSON blob from the caller (the coordinator's prompt accounting, data
  cursor...);
- `manifest.json`, written last: every file's SHA-256, signed with the job's token
  (`checkpoint_manifest.py`). `load` refuses a checkpoint it does not verify, before opening any
  file: its pickles could run code.

A checkpoint loads at any world size (an elastic restart: the trainers come back with another number
of ranks): both backends restore the weights and the whole optimizer state exactly (DeepSpeed re-cuts
its ZeRO partitions, `engines/zero_reshard.py`); ranks the checkpoint did not have keep their
seeded RNG state.

Saving is collective and atomic: every rank writes into `<root>/.tmp-step-00000042/`, then rank 0
writes `meta.json` and renames the directory into place; a crash leaves only a `.tmp-` directory,
which `latest` ignores and the next save of that step replaces. All ranks must see the same
`root` (one machine, or a ReadWriteMany volume in a cluster).

Neighbours: `engines/base.py` (`save_checkpoint` / `load_checkpoint` write the backend's part),
the trainer role's main loop (decides when, supplies `extra`, restores its own state from it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import shutil
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from plrl_workers import checkpoint_manifest

if TYPE_CHECKING:
    from plrl_workers.engines import base

PREFIX = "step-"
# Files a tokenizer may consist of; copied from the original model directory next to the weights.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)


@dataclasses.dataclass(frozen=True)
class Meta:
    """What `meta.json` holds."""

    step: int
    version: int
    created: float
    extra: dict[str, Any]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def dir_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def checkpoints(root: str | pathlib.Path) -> list[pathlib.Path]:
    """Complete checkpoints under `root`, oldest first (a directory counts once it has meta.json)."""
    r = pathlib.Path(root)
    if not r.is_dir():
        return []
    found = [p for p in r.iterdir() if p.name.startswith(PREFIX) and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest(root: str | pathlib.Path) -> pathlib.Path | None:
    """The newest complete checkpoint under `root`, or None."""
    found = checkpoints(root)
    return found[-1] if found else None


def read_meta(path: str | pathlib.Path) -> Meta:
    d = json.loads((pathlib.Path(path) / "meta.json").read_text())
    return Meta(step=int(d["step"]), version=int(d["version"]), created=float(d["created"]), extra=d["extra"])


def _save_rng(directory: pathlib.Path, rank: int) -> None:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    (directory / "rng").mkdir(exist_ok=True)
    torch.save(state, directory / "rng" / f"rank{rank}.pt")


def _load_rng(directory: pathlib.Path, rank: int) -> None:
    f = directory / "rng" / f"rank{rank}.pt"
    if not f.is_file():
        return  # a run with more ranks than the checkpoint: new ranks keep their seeded state
    state = torch.load(f, weights_only=True)
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_json(path: pathlib.Path, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def prune(root: str | pathlib.Path, keep: int) -> list[pathlib.Path]:
    """Delete all but the newest `keep` checkpoints; returns what was deleted."""
    found = checkpoints(root)
    doomed = found[: max(0, len(found) - keep)]
    for p in doomed:
        shutil.rmtree(p)
    return doomed


def save(
    engine: base.TrainingEngine,
    root: str | pathlib.Path,
    step: int,
    *,
    key: bytes,
    extra: dict[str, Any] | None = None,
    keep: int = 3,
    tokenizer_from: str | pathlib.Path | None = None,
) -> pathlib.Path:
    """Collective: write checkpoint `step` atomically, signed with `key`
    (`checkpoint_manifest.signing_key`), prune to `keep`; returns its directory."""
    root = pathlib.Path(root)
    final = root / dir_name(step)
    tmp = root / f".tmp-{dir_name(step)}"
    rank = _rank()
    blob = json.dumps(extra or {})  # fail before any I/O if the blob is not JSON
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()
    engine.save_checkpoint(tmp)
    _save_rng(tmp, rank)
    _barrier()
    if rank == 0:
        if tokenizer_from is not None:
            for name in _TOKENIZER_FILES:
                src = pathlib.Path(tokenizer_from) / name
                if src.is_file() and not (tmp / "model" / name).exists():
                    shutil.copy2(src, tmp / "model" / name)
        meta = {"step": step, "version": engine.version, "created": time.time(), "extra": json.loads(blob)}
        _write_json(tmp / "meta.json", meta)
        checkpoint_manifest.write(tmp, key)
        if final.exists():
            old = root / f".old-{dir_name(step)}"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old)
        else:
            os.rename(tmp, final)
        dir_fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        prune(root, keep)
    _barrier()
    return final


def load(engine: base.TrainingEngine, path: str | pathlib.Path, *, key: bytes) -> Meta:
    """Collective: restore the engine (weights, optimizer, version) and this rank's RNG state from a
    checkpoint signed with `key`; `checkpoint_manifest.CheckpointRefused` (nothing loaded) if not."""
    p = pathlib.Path(path)
    checkpoint_manifest.verify(p, key)
    meta = read_meta(p)
    engine.load_checkpoint(p)
    if engine.version != meta.version:
        raise ValueError(
            f"checkpoint {p}: engine version {engine.version} != meta.json version {meta.version}"
        )
    _load_rng(p, _rank())
    return meta


def resume(engine: base.TrainingEngine, root: str | pathlib.Path, *, key: bytes) -> Meta | None:
    """Load the latest checkpoint under `root` if there is one; None means start fresh."""
    p = latest(root)
    return load(engine, p, key=key) if p is not None else None
