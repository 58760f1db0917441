"""Reusable bucket buffers, so a version is packed into warm memory instead of fresh pages.

A fresh multi-megabyte CPU allocation is fresh pages from the kernel: every page faults on first
write, which costs more than the copy itself (about 2.5 s per version for a 14 GB model). The
sender keeps its bucket buffers here between versions; a published snapshot returns its buffers
when the last reference to it goes away (a pull in progress holds one). Neighbours: `sender.py`,
`receiver.py` (opt-in, see `WeightReceiver`).
"""

from __future__ import annotations

import collections
import threading
import weakref

import torch


class BufferPool:
    """Free uint8 buffers by (device, size); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: collections.defaultdict[tuple[str, int], list[torch.Tensor]] = collections.defaultdict(
            list
        )

    def get(self, nbytes: int, device: torch.device) -> torch.Tensor:
        with self._lock:
            free = self._free.get((str(device), nbytes))
            if free:
                return free.pop()
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def put(self, bufs: list[torch.Tensor]) -> None:
        with self._lock:
            for b in bufs:
                self._free[(str(b.device), b.numel())].append(b)

    def put_when_gone(self, owner: object, bufs: list[torch.Tensor]) -> None:
        """Give `bufs` back once `owner` (e.g. a published snapshot) is garbage."""
        weakref.finalize(owner, self.put, bufs)
