"""A generator stand-in for the weight-sync tests: a real process that receives broadcasts.

Writes {"ready": true} once imported, then reads one JSON command per stdin line and writes one JSON
result per stdout line:
  {"cmd": "update", "group": {...GroupInfo}, "ann": {...Announcement}}
      -> {"version": v, "epoch": e, "names": [...], "digests": {name: sha256 of the tensor's bytes}}
      or {"version": v, "epoch": e, "aborted": true} when the sender aborted that version
  {"cmd": "pull", "target": "host:port", "token": t, "min_version": v}
      -> {"version": v, "names": [...], "digests": {...}} pulled over gRPC from the coordinator
  {"cmd": "exit"} -> exits
Run as a script (`python receiver_proc.py [DEVICE]`, DEVICE "cpu" by default or e.g. "cuda:1" for
nccl), so it needs nothing from the test's process.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch

from plrl_workers import protocol
from plrl_workers.weight_sync import groups, receiver


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    rx: receiver.WeightReceiver | None = None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "exit":
            break
        if msg["cmd"] == "pull":
            from plrl_workers.rpc import client  # grpc only when needed: startup stays short

            with client.CoordinatorClient(msg["target"], msg["token"]) as c:
                pulled = c.pull_weights("peer", msg["min_version"])
                got = {name: digest(t) for name, t in pulled.named_tensors}
            print(json.dumps({"version": pulled.version, "names": list(got), "digests": got}), flush=True)
            continue
        g = protocol.GroupInfo(**msg["group"])
        a = msg["ann"]
        ann = protocol.Announcement(
            version=a["version"],
            epoch=a["epoch"],
            params=tuple(protocol.ParamMeta(p["name"], p["dtype"], tuple(p["shape"])) for p in a["params"]),
            bucket_bytes=a["bucket_bytes"],
        )
        if rx is None or rx.group != g:  # a new epoch (or a restarted trainer): a new group
            if rx is not None:
                rx.close()
            rx = receiver.WeightReceiver(g, device, timeout_s=60.0)
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
