"""A generator stand-in for the weight-sync tests: a real process that receives broadcasts.

Reads one JSON command per stdin line, writes one JSON result per stdout line:
  {"cmd": "update", "group": {...GroupInfo}, "ann": {...Announcement}}
      -> {"version": v, "epoch": e, "digests": {name: sha256 of the tensor's bytes}}
      or {"version": v, "aborted": true} when the sender aborted that version
  {"cmd": "exit"} -> exits
Run as a script (`python receiver_proc.py`), so it needs nothing from the test's process.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch
from plrl_workers.weight_sync import base, groups, receiver


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def main() -> None:
    rx: receiver.WeightReceiver | None = None
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "exit":
            break
        g = base.GroupInfo(**msg["group"])
        a = msg["ann"]
        ann = base.Announcement(
            version=a["version"],
            epoch=a["epoch"],
            params=tuple(base.ParamMeta(p["name"], p["dtype"], tuple(p["shape"])) for p in a["params"]),
            bucket_bytes=a["bucket_bytes"],
        )
        if rx is None or rx.group.epoch != g.epoch:
            if rx is not None:
                rx.close()
            rx = receiver.WeightReceiver(g, "cpu", timeout_s=60.0)
        try:
            out = {name: digest(t) for name, t in rx.receive(ann)}
            result: dict[str, object] = {
                "version": ann.version,
                "epoch": ann.epoch,
                "names": list(out),
                "digests": out,
            }
        except groups.GroupAborted:
            rx.close()
            rx = None
            result = {"version": ann.version, "epoch": ann.epoch, "aborted": True}
        print(json.dumps(result), flush=True)
    if rx is not None:
        rx.close()


if __name__ == "__main__":
    main()
