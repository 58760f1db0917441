"""Signed checkpoint manifests: a checkpoint loads only if every file is as this job saved it.

Loading a checkpoint unpickles files (DeepSpeed reads its ZeRO partitions with
`torch.load(weights_only=False)`, and so must the elastic re-cut), and unpickling runs whatever code
the file names. So anyone who can write the checkpoint volume could run code in the trainer.
`write` records the SHA-256 of every file of a checkpoint in `manifest.json` and signs the list
with an HMAC keyed by the job's checkpoint key (a Secret only the job's pods mount, kept when the
job is deleted so that the job applied again resumes); `verify` refuses a
checkpoint whose manifest is missing, not signed with this key, or does not match the files (one
changed, added or removed), before any file is opened for loading. Verifying reads every byte once
(SHA-256, about 1 GB/s per core).

What it does not cover: a writer who also holds the key (whoever can read the namespace's Secrets),
and files swapped between `verify` and the load.

Neighbours: `checkpoint.py` (writes the manifest last in `save`, verifies first in `load`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import pathlib

MANIFEST = "manifest.json"
_FORMAT = 1
_CHUNK = 1 << 20


class CheckpointRefused(ValueError):
    """A checkpoint that may not be loaded; the message names the checkpoint and why."""


def signing_key(secret: str) -> bytes:
    """The manifest key derived from the job's checkpoint key (or its token, where the job has
    none); derived, so that a manifest's MAC says nothing about the secret itself."""
    return hmac.new(secret.encode(), b"plrl checkpoint manifest v1", hashlib.sha256).digest()


def _digest(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files(directory: pathlib.Path) -> dict[str, str]:
    """Every regular file under `directory` but the manifest, by relative path: its SHA-256."""
    out = {}
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory).as_posix()
        if rel == MANIFEST:
            continue
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            raise CheckpointRefused(f"checkpoint {directory}: {rel} is not a regular file")
        if p.is_file():
            out[rel] = _digest(p)
    return out


def _mac(key: bytes, files: dict[str, str]) -> str:
    body = json.dumps({"format": _FORMAT, "files": files}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def write(directory: pathlib.Path, key: bytes) -> None:
    """Sign what `directory` holds now (call once every file of the checkpoint is written)."""
    files = _files(directory)
    doc = {"format": _FORMAT, "files": files, "hmac": _mac(key, files)}
    (directory / MANIFEST).write_text(json.dumps(doc, indent=1, sort_keys=True))


def verify(directory: pathlib.Path, key: bytes) -> None:
    """Raise `CheckpointRefused` unless `directory` holds exactly the files its manifest signs."""
    path = directory / MANIFEST
    try:
        doc = json.loads(path.read_text())
        signed, mac = dict(doc["files"]), str(doc["hmac"])
    except FileNotFoundError:
        raise CheckpointRefused(
            f"checkpoint {directory}: no {MANIFEST}, so nothing says this job wrote it (checkpoints "
            "are signed since issue 11; an unsigned one is never loaded: its files could run code)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointRefused(f"checkpoint {directory}: {MANIFEST} is unreadable: {err}") from None
    if not hmac.compare_digest(mac, _mac(key, signed)):
        raise CheckpointRefused(
            f"checkpoint {directory}: {MANIFEST} is not signed with this job's token (changed after it "
            "was saved, or saved by another job)"
        )
    found = _files(directory)
    for rel in sorted(signed.keys() | found.keys()):
        if rel not in found:
            raise CheckpointRefused(f"checkpoint {directory}: {rel} is signed but missing")
        if rel not in signed:
            raise CheckpointRefused(f"checkpoint {directory}: {rel} was added after it was saved")
        if not hmac.compare_digest(found[rel], signed[rel]):
            raise CheckpointRefused(f"checkpoint {directory}: {rel} changed after it was saved")
