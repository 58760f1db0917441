"""The kubelet's log endpoint for the fake nodes, so `kubectl logs` works on pods the process runner runs.

`kubectl logs POD -c C [-f] [--previous] [--tail N] [--limit-bytes B]` goes to the API server, which
calls `GET https://<node InternalIP>:<node daemonEndpoints port>/containerLogs/<ns>/<pod>/<container>`
with its kubelet client certificate. This agent serves that path over TLS (the API server's serving
certificate; client certificates are verified against the cluster CA, so only the API server gets in),
from the files the runner writes: `<state>/logs/<ns>_<pod>_<uid>/<container>/<restartCount>.log`
(`--previous`: the one before). `follow` streams until the container stops. The agent writes its
port into each fake node's status (node_agent), and controlplane.py starts the API server with
`--kubelet-preferred-address-types=InternalIP` and the client certificate.

`log_file` and `tail` are pure. Neighbours: pod_runner.py (`LogSource`), node_agent.py (starts this).
"""

from __future__ import annotations

import http.server
import logging
import pathlib
import ssl
import threading
import time
import urllib.parse
from typing import Protocol

log = logging.getLogger("node-agent.logs")
FOLLOW_POLL_S = 0.2


class LogSource(Protocol):
    def log_dir(self, namespace: str, pod: str) -> pathlib.Path | None: ...

    def container_running(self, namespace: str, pod: str, container: str) -> bool: ...


def log_file(pod_dir: pathlib.Path, container: str, previous: bool) -> pathlib.Path | None:
    """The current run's log of `container` (or, `previous`, the run before it)."""
    runs = sorted(
        (p for p in (pod_dir / container).glob("*.log") if p.stem.isdigit()), key=lambda p: int(p.stem)
    )
    if previous:
        return runs[-2] if len(runs) >= 2 else None
    return runs[-1] if runs else None


def tail(data: bytes, lines: int | None, limit_bytes: int | None) -> bytes:
    """The last `lines` lines of `data`, then at most its first `limit_bytes` bytes (kubectl's order)."""
    if lines is not None:
        if lines <= 0:
            data = b""
        else:
            parts = data.splitlines(keepends=True)
            data = b"".join(parts[-lines:])
    if limit_bytes is not None:
        data = data[:limit_bytes]
    return data


def _int(query: dict[str, list[str]], key: str) -> int | None:
    raw = query.get(key, [""])[0]
    return int(raw) if raw.lstrip("-").isdigit() else None


def handler(sources: list[LogSource]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            log.debug(format, *args)

        def _fail(self, code: int, message: str) -> None:
            body = message.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # http.server's naming
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self._fail(404, f"not found: {url.path}")
                return
            _, ns, pod, container = parts
            query = urllib.parse.parse_qs(url.query)
            previous = query.get("previous", ["false"])[0] == "true"
            found = next((d for d in (s.log_dir(ns, pod) for s in sources) if d is not None), None)
            path = log_file(found, container, previous) if found is not None else None
            if path is None:
                what = "previous terminated container" if previous else "container"
                self._fail(404, f'{what} "{container}" in pod "{pod}" not found (no logs on this node)')
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            data = path.read_bytes()
            out = tail(data, _int(query, "tailLines"), _int(query, "limitBytes"))
            self.wfile.write(out)
            if query.get("follow", ["false"])[0] != "true" or previous:
                return
            offset = len(data)
            while True:
                try:
                    with path.open("rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                except OSError:
                    return
                if chunk:
                    offset += len(chunk)
                    try:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    except OSError:
                        return  # the client went away
                elif not any(s.container_running(ns, pod, container) for s in sources):
                    return
                time.sleep(FOLLOW_POLL_S)

    return Handler


def serve(pki_dir: pathlib.Path, sources: list[LogSource], host: str = "127.0.0.1") -> int:
    """Start serving in a daemon thread; returns the port."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki_dir / "apiserver.crt", pki_dir / "apiserver.key")
    ctx.load_verify_locations(pki_dir / "ca.crt")
    ctx.verify_mode = ssl.CERT_REQUIRED
    server = http.server.ThreadingHTTPServer((host, 0), handler(sources))
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="kubelet-logs", daemon=True).start()
    port: int = server.server_address[1]
    log.info("serving container logs on %s:%d", host, port)
    return port
