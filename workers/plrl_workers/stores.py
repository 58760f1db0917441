"""The trainers' two rendezvous stores (torch.distributed `TCPStore`s), bound where they should be.

Trainer rank 0 hosts both: the default process group's (the trainer ranks meet there) and the
weight sync's (`weight_sync.groups`). A store has no authentication, and torch's own server
listens on every interface; a master given `bind_host` listens on that address only, through a
socket bound here and handed over (`master_listen_fd`). `plrl run` binds loopback; in a pod the
job's NetworkPolicy keeps other pods away.
"""

from __future__ import annotations

import datetime
import socket

from torch._C import _distributed_c10d as c10d


def tcp_store(
    host: str, port: int, *, is_master: bool, timeout_s: float, bind_host: str | None = None
) -> c10d.TCPStore:
    """A client of the store at `host:port`, or (`is_master`) the store itself, on `port` (0: any
    free port; see `.port`), listening on `bind_host` only when given."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if not is_master or bind_host is None or bind_host in ("0.0.0.0", "::"):
        return c10d.TCPStore(host, port, None, is_master, timeout, wait_for_workers=False)
    sock = socket.create_server((bind_host, port), backlog=1024)
    bound = sock.getsockname()[1]
    # The store owns the descriptor from here on: detached, Python never closes it under the store.
    fd = sock.detach()
    return c10d.TCPStore(
        host, bound, None, True, timeout, wait_for_workers=False, master_listen_fd=fd, use_libuv=True
    )
