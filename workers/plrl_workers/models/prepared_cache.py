"""Prepared built-in models, kept once per machine and copied into each run directory.

Building `builtin:tiny` and warm-starting it costs a process that imports torch and transformers
and trains for `model.warmStartSteps` steps: tens of seconds on a laptop, every time a new run
directory is used. The result depends only on its inputs, so it is stored under a key made of them
(model seed, task, warm-start settings, the versions of torch and transformers, and the source of
the code that builds and trains it) and later runs copy it, without importing torch at all. Like
the Hugging Face cache, it lives in `$PLRL_CACHE_DIR` (default `$XDG_CACHE_HOME/plrl`, else
`~/.cache/plrl`), under `models/`; deleting it is always safe.

Neighbours: `prepare.py` (the caller), `models/tiny.py` and `tasks/warm_start.py` (what is cached).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import os
import pathlib
import shutil
import types
import uuid
from collections.abc import Iterable

from plrl_workers import machine_cache

CACHE_ENV = "PLRL_CACHE_DIR"
KEY_FILE = "plrl-prepared-key.json"
# Distributions whose numerics decide the weights: a new version may give different ones.
VERSIONED = ("torch", "transformers", "tokenizers", "safetensors")


def root() -> pathlib.Path:
    """Where prepared models are kept: `$PLRL_CACHE_DIR/models`, by default under ~/.cache/plrl."""
    explicit = os.environ.get(CACHE_ENV)
    return (pathlib.Path(explicit) if explicit else machine_cache.home()) / "models"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def key(inputs: dict[str, object], code: Iterable[types.ModuleType | type]) -> str:
    """A key for a prepared model: its `inputs` (JSON-able), the source of the modules or classes in
    `code` (a change to how the model is built or trained makes a new key) and library versions."""
    h = hashlib.sha256()
    h.update(json.dumps(inputs, sort_keys=True, default=repr).encode())
    for obj in code:
        h.update(inspect.getsource(obj).encode())
    h.update(json.dumps({d: _version(d) for d in VERSIONED}).encode())
    return h.hexdigest()[:24]


def _holds(directory: pathlib.Path, k: str) -> bool:
    try:
        return bool(json.loads((directory / KEY_FILE).read_text()).get("key") == k)
    except (OSError, ValueError):
        return False


def _copy_atomically(src: pathlib.Path, dst: pathlib.Path, k: str) -> None:
    """Copy `src` to `dst` through a sibling temporary directory, stamped with `k`: a crash or a
    concurrent run never leaves a half-written `dst`, and an existing complete one is kept."""
    if _holds(dst, k):
        return
    tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp")
    shutil.copytree(src, tmp)
    (tmp / KEY_FILE).write_text(json.dumps({"key": k}))
    if dst.exists():
        if _holds(dst, k):  # a concurrent run finished first
            shutil.rmtree(tmp)
            return
        shutil.rmtree(dst)
    try:
        tmp.rename(dst)
    except OSError:  # another process put a complete copy there first
        shutil.rmtree(tmp, ignore_errors=True)
        if not _holds(dst, k):
            raise


def fetch(k: str, out: pathlib.Path, cache: pathlib.Path | None = None) -> pathlib.Path | None:
    """Put the prepared model `k` at `out` if `out` or the cache has it; the cache entry it came
    from (or `out` itself), or None when it must be built."""
    if _holds(out, k):
        return out
    entry = (cache or root()) / k
    if not _holds(entry, k):
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    _copy_atomically(entry, out, k)
    return entry


def store(k: str, built: pathlib.Path, cache: pathlib.Path | None = None) -> pathlib.Path | None:
    """Keep a copy of `built` as entry `k` and stamp `built` with it; the entry, or None when the
    cache cannot be written (a read-only home is no reason to fail a run)."""
    (built / KEY_FILE).write_text(json.dumps({"key": k}))
    entry = (cache or root()) / k
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        _copy_atomically(built, entry, k)
    except OSError:
        return None
    return entry
