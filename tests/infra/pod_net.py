"""Pod networking for the fake nodes: a network namespace per pod on a bridge, peers by /etc/hosts,
and the `kubernetes` Service's ClusterIP reachable from every pod.

- **Addresses.** Each node agent owns one bridge `plrlbr<k>` carrying the first address of its own
  /23 inside 198.18.0.0/15 (RFC 2544's benchmark range: never routed, and unlike loopback accepted in
  EndpointSlices). A pod's sandbox gets a veth pair: `eth0` with the next free address in its network
  namespace, the other end on the bridge. Pods reach each other (and the agent reaches them for
  probes) through the bridge; each pod has every port to itself (the worker ports are fixed per pod).
  Several agents on one machine (a `make cluster-up` cluster and a pytest run) take different /23s,
  chosen under a lock; a bridge left by an agent that was SIGKILLed is deleted by the next one.
- **Names.** There is no cluster DNS: each pod's /etc/hosts (bound over the file by the shim) maps
  `<hostname>.<subdomain>.<ns>.svc[.cluster.local]` of every pod with a hostname and subdomain in the
  same namespace (what CoreDNS serves for a headless Service's pods) to its current address, plus the
  pod's own name, as a kubelet writes it. The runner rewrites the files in place when a peer appears,
  moves or goes. /etc/resolv.conf names no server, so other names fail at once instead of timing out.
- **The API server.** Pods get `KUBERNETES_SERVICE_HOST=10.0.0.1` (the `kubernetes` Service) as in a
  cluster. 10.0.0.1 is an address on each pod's loopback where the agent listens *inside the pod's
  network namespace* and forwards every connection to the API server on the host's loopback (TLS
  passes through; the serving certificate names 10.0.0.1). This is kube-proxy's job, done per pod.

Pure parts (`pick_subnet`, `AddressPool`, `hosts_file`, `resolv_conf`) are unit-tested; the rest
runs `ip` and opens sockets. Neighbours: pod_shim.py (the sandbox whose namespace this configures),
pod_runner.py (the caller), linux.py (setns for the forwarder's listening socket).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import logging
import os
import pathlib
import socket
import subprocess
import threading
from collections.abc import Iterable, Sequence

from tests.infra import linux

log = logging.getLogger("node-agent.net")

POD_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
SUBNET_PREFIX = 23
BRIDGE_PREFIX = "plrlbr"
LOCK_FILE = pathlib.Path("/run/plrl-pod-net.lock")
CLUSTER_DOMAIN = "cluster.local"


# --------------------------------------------------------------------------- pure


def pick_subnet(in_use: Iterable[ipaddress.IPv4Network]) -> tuple[int, ipaddress.IPv4Network]:
    """The first /23 of POD_RANGE that overlaps no network in use, and its index."""
    used = list(in_use)
    for k, net in enumerate(POD_RANGE.subnets(new_prefix=SUBNET_PREFIX)):
        if not any(net.overlaps(u) for u in used):
            return k, net
    raise RuntimeError(f"every /{SUBNET_PREFIX} of {POD_RANGE} is in use")


class AddressPool:
    """Pod addresses of one subnet: the first is the bridge's (the pods' gateway)."""

    def __init__(self, subnet: ipaddress.IPv4Network) -> None:
        hosts = list(subnet.hosts())
        self.subnet = subnet
        self.gateway = hosts[0]
        self._free = hosts[1:]
        self._taken: dict[str, ipaddress.IPv4Address] = {}

    def take(self, owner: str) -> ipaddress.IPv4Address:
        if owner in self._taken:
            return self._taken[owner]
        if not self._free:
            raise RuntimeError(f"no free pod address in {self.subnet}")
        self._taken[owner] = addr = self._free.pop(0)
        return addr

    def release(self, owner: str) -> None:
        addr = self._taken.pop(owner, None)
        if addr is not None:
            self._free.append(addr)  # reused last: a stale /etc/hosts entry rarely points at a new pod


@dataclasses.dataclass(frozen=True)
class PeerRecord:
    """One pod as the names of its peers see it."""

    namespace: str
    hostname: str
    subdomain: str | None
    ip: str

    def names(self) -> list[str]:
        if not self.subdomain:
            return []
        base = f"{self.hostname}.{self.subdomain}.{self.namespace}.svc"
        return [f"{base}.{CLUSTER_DOMAIN}", base]


def hosts_file(me: PeerRecord, peers: Sequence[PeerRecord]) -> str:
    """/etc/hosts of pod `me`: loopback, its own names (as a kubelet writes them), then its peers'
    (what cluster DNS would answer), sorted so an unchanged set gives an identical file."""
    lines = [
        "# Kubernetes-managed hosts file (plrl node agent: peers listed in place of cluster DNS).",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{me.ip}\t{' '.join([*me.names(), me.hostname])}",
    ]
    for p in sorted(peers, key=lambda p: (p.hostname, p.ip)):
        if p.namespace == me.namespace and p.hostname != me.hostname and p.names():
            lines.append(f"{p.ip}\t{' '.join(p.names())}")
    return "\n".join(lines) + "\n"


def resolv_conf(namespace: str) -> str:
    """Search domains as in a cluster; no nameserver (lookups not in /etc/hosts fail at once)."""
    return (
        f"search {namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n"
        "nameserver 127.0.0.1\noptions ndots:5 attempts:1 timeout:1\n"
    )


def veth_name(ip: ipaddress.IPv4Address) -> str:
    """The host end of a pod's veth pair: unique per address, within IFNAMSIZ (15)."""
    return f"plv{int(ip):08x}"


def write_in_place(path: pathlib.Path, text: str) -> bool:
    """Rewrite `path` keeping its inode (it is bind-mounted into running pods); False if unchanged."""
    data = text.encode()
    with contextlib.suppress(FileNotFoundError):
        if path.read_bytes() == data:
            return False
    with path.open("r+b" if path.exists() else "wb") as f:
        f.write(data)
        f.truncate()
    return True


# --------------------------------------------------------------------------- ip(8)


def _ip(*args: str, stdin: str | None = None, netns_pid: int | None = None) -> str:
    argv = ["ip", *args]
    if netns_pid is not None:
        argv = ["nsenter", f"--net=/proc/{netns_pid}/ns/net", *argv]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout


def available() -> str | None:
    """Why pods cannot run here, or None: the runtime needs root, ip(8) and nsenter(1)."""
    if os.geteuid() != 0:
        return "the process runner needs root (network and mount namespaces)"
    for tool in ("ip", "nsenter"):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode != 0:
            return f"the process runner needs {tool} on PATH"
    return None


def _addresses() -> list[dict[str, object]]:
    out: list[dict[str, object]] = json.loads(_ip("-j", "addr", "show") or "[]")
    return out


def bridges() -> dict[str, int]:
    """This machine's agent bridges and the pid of the agent that made each (from its alias)."""
    out = {}
    for link in pathlib.Path("/sys/class/net").glob(f"{BRIDGE_PREFIX}*"):
        try:
            alias = (link / "ifalias").read_text().strip()
        except OSError:
            continue
        if alias.startswith("pid=") and alias.removeprefix("pid=").isdigit():
            out[link.name] = int(alias.removeprefix("pid="))
    return out


def _alive(pid: int) -> bool:
    try:
        return b"node_agent" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class Bridge:
    """This agent's bridge and address pool; `close()` deletes the bridge (and so every veth on it)."""

    def __init__(self, name: str, pool: AddressPool) -> None:
        self.name = name
        self.pool = pool
        self._lock = threading.Lock()

    @classmethod
    def create(cls) -> Bridge:
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        with LOCK_FILE.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for name, owner in bridges().items():  # bridges of agents that died without cleaning up
                if not _alive(owner):
                    log.info("deleting stale bridge %s (agent pid %d is gone)", name, owner)
                    with contextlib.suppress(RuntimeError):
                        _ip("link", "del", name)
            in_use = [
                ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False)
                for link in _addresses()
                for a in link.get("addr_info", [])  # type: ignore[attr-defined]
                if a.get("family") == "inet"
            ]
            k, subnet = pick_subnet(in_use)
            name = f"{BRIDGE_PREFIX}{k}"
            pool = AddressPool(subnet)
            _ip("link", "add", name, "type", "bridge")
            _ip("link", "set", name, "alias", f"pid={os.getpid()}")
            _ip("addr", "add", f"{pool.gateway}/{subnet.prefixlen}", "dev", name)
            _ip("link", "set", name, "up")
        log.info("bridge %s: pods in %s, gateway %s", name, subnet, pool.gateway)
        return cls(name, pool)

    def attach(self, owner: str, sandbox_pid: int, service_ip: str) -> str:
        """Give the sandbox `sandbox_pid` its eth0 on this bridge; returns the pod's address."""
        with self._lock:
            ip = self.pool.take(owner)
        host_end = veth_name(ip)
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", host_end)  # left by a sandbox that died mid-setup
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", str(sandbox_pid))
        _ip("link", "set", host_end, "master", self.name, "up")
        batch = (
            f"addr add {ip}/{self.pool.subnet.prefixlen} dev eth0\n"
            "link set eth0 up\n"
            f"route add default via {self.pool.gateway}\n"
            f"addr add {service_ip}/32 dev lo\n"
        )
        _ip("-batch", "-", stdin=batch, netns_pid=sandbox_pid)
        return str(ip)

    def detach(self, owner: str, ip: str | None) -> None:
        """Release the pod's address (its veth went with its namespace)."""
        if ip:
            with contextlib.suppress(RuntimeError, ValueError):
                _ip("link", "del", veth_name(ipaddress.IPv4Address(ip)))
        with self._lock:
            self.pool.release(owner)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", self.name)


# --------------------------------------------------------------------------- the kubernetes Service


def listen_in(netns: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket inside the network namespace file `netns` (e.g. /proc/<pid>/ns/net).

    setns() changes only the calling thread's namespace, so a throwaway thread makes the socket;
    the socket stays in that namespace for its whole life, whoever uses it."""
    box: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            linux.setns(netns, linux.CLONE_NEWNET)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            s.listen(64)
            box.append(s)
        except BaseException as err:  # handed to the caller
            box.append(err)

    t = threading.Thread(target=make, name="listen-in-netns")
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


class Forwarder:
    """Accepts on a socket inside a pod's namespace, relays each connection to `target` on the host."""

    def __init__(self, listener: socket.socket, target: tuple[str, int], name: str) -> None:
        self._listener = listener
        self._target = target
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"fwd-{name}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError as err:
                log.warning("forwarder: %s unreachable: %s", self._target, err)
                client.close()
                continue
            upstream.settimeout(None)
            pair = (client, upstream)
            with self._lock:
                self._conns |= set(pair)
            done = threading.Semaphore(0)
            for a, b in (pair, pair[::-1]):
                threading.Thread(target=self._pipe, args=(a, b, done, pair), daemon=True).start()

    def _pipe(
        self,
        src: socket.socket,
        dst: socket.socket,
        done: threading.Semaphore,
        pair: tuple[socket.socket, socket.socket],
    ) -> None:
        """One direction; the second direction to finish closes both sockets."""
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        done.release()
        if src is pair[1]:  # the upstream->client thread waits for the other, then closes
            done.acquire()
            done.acquire()
            with self._lock:
                self._conns -= set(pair)
            for sock in pair:
                sock.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            conns, self._conns = set(self._conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
