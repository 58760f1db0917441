"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler (all from the plrl-k8s binary), plus the node agent that plays kubelet for fake nodes.

Each component is its own process, logging to <work_dir>/logs/<component>.log. RBAC is on, the
ServiceAccount admission plugin and the TokenRequest API work (the service-account issuer and keys are
set), and the admin kubeconfig (client cert in system:masters) is written to <work_dir>/admin.kubeconfig.

    with ControlPlane(tmp_path).start() as cp:
        subprocess.run([kubectl, "--kubeconfig", cp.kubeconfig, "get", "ns"])

Neighbours: binaries.py (builds plrl-k8s), procs.py (process plumbing), node_agent.py (started here),
nodes.py (fake GPU nodes), cluster.py (`make cluster-up`: starts one detached, stops it later).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import os
import pathlib
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import yaml

from tests.infra import binaries, procs

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # the first address of SERVICE_CIDR: the default/kubernetes Service
# Everything except the node lifecycle controller: fake nodes send no heartbeats, and with it on they
# would be tainted unreachable and their pods evicted. node-ipam needs pod CIDRs nobody routes.
CONTROLLERS = "*,-node-lifecycle-controller,-node-ipam-controller"
STATE_FILE = "state.json"


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What tests get from the `control_plane` fixture: where the cluster is, how to reach it as admin."""

    kubeconfig: pathlib.Path
    server: str
    logs: pathlib.Path | None  # component logs; None for a reused `make cluster-up` cluster
    node_state: pathlib.Path | None = None
    """The node agent's pod state: `logs/<ns>_<pod>_<uid>/<container>/<n>.log`, `pods/<uid>/`."""


@dataclasses.dataclass
class Component:
    name: str
    argv: list[str]
    health: Callable[[], bool]
    proc: subprocess.Popen[bytes] | None = None


class ControlPlaneError(RuntimeError):
    """A component failed to start or become healthy; the message ends with the tail of its log."""


class ControlPlane:
    """Starts and stops the control plane; see the module docstring."""

    def __init__(
        self,
        work_dir: pathlib.Path,
        *,
        plrl_k8s: pathlib.Path | None = None,
        node_agent: bool = True,
        backoff_s: tuple[float, float] = (1.0, 10.0),
        detach: bool = False,
        start_timeout_s: float = 120.0,
    ) -> None:
        """backoff_s: the node agent's CrashLoopBackOff (first delay, longest delay) for pods it runs;
        a kubelet's are (10, 300), scaled down so crash-looping tests end in seconds.
        detach=True: the processes outlive this Python process (cluster-up); otherwise they are
        killed when it dies, so a killed pytest leaves nothing running."""
        self.work_dir = work_dir.resolve()
        self._plrl_k8s = plrl_k8s
        self._node_agent = node_agent
        self._backoff_s = backoff_s
        self._detach = detach
        self._timeout = start_timeout_s
        self._components: list[Component] = []
        self.pki = self.work_dir / "pki"
        self.logs = self.work_dir / "logs"
        self.kubeconfig = self.work_dir / "admin.kubeconfig"
        self.node_state = self.work_dir / "node-agent"
        self.api_port = 0
        self.server = ""
        self.timings: dict[str, float] = {}  # start-up phase -> seconds since start() began
        self._t0 = 0.0

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stops every component, newest first (SIGTERM, then SIGKILL after 10 s)."""
        for c in reversed(self._components):
            if c.proc is not None:
                procs.terminate(c.proc.pid, functools.partial(procs.exited, c.proc))
                c.proc.wait()
        self._components.clear()
        (self.work_dir / STATE_FILE).unlink(missing_ok=True)

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _mark(self, phase: str) -> None:
        self.timings[phase] = time.monotonic() - self._t0

    def _start(self) -> None:
        self._t0 = time.monotonic()
        exe = self._plrl_k8s or binaries.ensure().plrl_k8s
        self.logs.mkdir(parents=True, exist_ok=True)
        procs.run(
            [str(exe), "certs", "--dir", str(self.pki), "--service-ip", SERVICE_IP], self.logs / "certs.log"
        )
        self._mark("certs")

        etcd_port, peer_port = procs.free_port(), procs.free_port()
        self.api_port = procs.free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self._launch(
            Component(
                "etcd",
                [str(exe), "etcd", f"--data-dir={self.work_dir / 'etcd'}",
                 f"--listen-client-url=http://127.0.0.1:{etcd_port}",
                 f"--listen-peer-url=http://127.0.0.1:{peer_port}"],
                lambda: procs.http_ok(f"http://127.0.0.1:{etcd_port}/health", None),
            )
        )  # fmt: skip
        # The apiserver retries etcd until it answers, so both start at once.
        pki = self.pki
        self._launch(
            Component(
                "kube-apiserver",
                [str(exe), "kube-apiserver",
                 f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                 "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                 f"--secure-port={self.api_port}",
                 f"--tls-cert-file={pki / 'apiserver.crt'}",
                 f"--tls-private-key-file={pki / 'apiserver.key'}",
                 f"--client-ca-file={pki / 'ca.crt'}",
                 # Published for the controller-manager's and scheduler's delegated authentication; no
                 # client cert has the allowed name, so nobody can assert identities through headers.
                 f"--requestheader-client-ca-file={pki / 'ca.crt'}",
                 "--requestheader-allowed-names=plrl-front-proxy",
                 "--requestheader-username-headers=X-Remote-User",
                 "--requestheader-group-headers=X-Remote-Group",
                 "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                 f"--cert-dir={self.work_dir / 'apiserver'}",
                 f"--service-cluster-ip-range={SERVICE_CIDR}",
                 f"--service-account-issuer={self.server}",
                 f"--service-account-key-file={pki / 'sa.pub'}",
                 f"--service-account-signing-key-file={pki / 'sa.key'}",
                 "--authorization-mode=RBAC",
                 # It taints every new Node not-ready until a node lifecycle controller sees a kubelet;
                 # fake nodes have neither, and a taint lifted after creation races the scheduler.
                 "--disable-admission-plugins=TaintNodesByCondition",
                 # Endpoints may not be loopback; pods reach the kubernetes Service through the node
                 # agent (tests/infra/pod_net.py), not through its endpoints.
                 "--endpoint-reconciler-type=none", "--allow-privileged=true", "--profiling=false",
                 # `kubectl logs`: the node agent serves the kubelet's log endpoint on the node's
                 # InternalIP (loopback) and verifies this client certificate.
                 "--kubelet-preferred-address-types=InternalIP",
                 f"--kubelet-client-certificate={pki / 'admin.crt'}",
                 f"--kubelet-client-key={pki / 'admin.key'}",
                 f"--kubelet-certificate-authority={pki / 'ca.crt'}"],
                lambda: procs.http_ok(f"{self.server}/readyz", self._admin_tls()),
            )
        )  # fmt: skip
        self._write_kubeconfig(self.kubeconfig, "admin")
        if self._node_agent:  # slowest to start (Python imports); it retries until the apiserver answers
            (self.work_dir / "node-agent.ready").unlink(missing_ok=True)
            self._launch(
                Component(
                    "node-agent",
                    [sys.executable, "-m", "tests.infra.node_agent", f"--kubeconfig={self.kubeconfig}",
                     f"--ready-file={self.work_dir / 'node-agent.ready'}",
                     f"--state-dir={self.node_state}", f"--api-server={self.server}",
                     f"--pki-dir={self.pki}", f"--backoff-base-s={self._backoff_s[0]}",
                     f"--backoff-max-s={self._backoff_s[1]}"],
                    lambda: (self.work_dir / "node-agent.ready").exists(),
                )
            )  # fmt: skip
        self._wait(self._components[:2])

        kcm_cfg = self.work_dir / "controller-manager.kubeconfig"
        sched_cfg = self.work_dir / "scheduler.kubeconfig"
        self._write_kubeconfig(kcm_cfg, "controller-manager")
        self._write_kubeconfig(sched_cfg, "scheduler")
        kcm_port, sched_port = procs.free_port(), procs.free_port()
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # self-signed serving certs
        self._launch(
            Component(
                "kube-controller-manager",
                [str(exe), "kube-controller-manager",
                 f"--kubeconfig={kcm_cfg}", f"--authentication-kubeconfig={kcm_cfg}",
                 f"--authorization-kubeconfig={kcm_cfg}",
                 "--bind-address=127.0.0.1", f"--secure-port={kcm_port}",
                 f"--cert-dir={self.work_dir / 'controller-manager'}",
                 "--leader-elect=false", f"--controllers={CONTROLLERS}",
                 "--use-service-account-credentials=true",
                 f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
                 f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                 f"--cluster-signing-key-file={pki / 'ca.key'}",
                 f"--service-cluster-ip-range={SERVICE_CIDR}", "--profiling=false"],
                lambda: procs.http_ok(f"https://127.0.0.1:{kcm_port}/healthz", insecure),
            )
        )  # fmt: skip
        self._launch(
            Component(
                "kube-scheduler",
                [str(exe), "kube-scheduler",
                 f"--kubeconfig={sched_cfg}", f"--authentication-kubeconfig={sched_cfg}",
                 f"--authorization-kubeconfig={sched_cfg}",
                 "--bind-address=127.0.0.1", f"--secure-port={sched_port}",
                 f"--cert-dir={self.work_dir / 'scheduler'}", "--leader-elect=false", "--profiling=false"],
                lambda: procs.http_ok(f"https://127.0.0.1:{sched_port}/healthz", insecure),
            )
        )  # fmt: skip
        self._wait(self._components[2:])
        # Pods are refused until their namespace's ServiceAccount exists (ServiceAccount admission).
        self._wait_for("the default ServiceAccount", self._default_sa_exists)
        self._mark("default ServiceAccount")
        self._write_state()

    # -- processes -------------------------------------------------------------------------------

    def _launch(self, c: Component) -> None:
        log = (self.logs / f"{c.name}.log").open("ab")
        env = dict(os.environ, PYTHONPATH=str(binaries.REPO))
        c.proc = subprocess.Popen(
            c.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=binaries.REPO,
            env=env,
            start_new_session=self._detach,
            preexec_fn=None if self._detach else procs.die_with_parent,
        )
        log.close()
        self._components.append(c)

    def _wait(self, comps: Sequence[Component]) -> None:
        pending = list(comps)
        deadline = time.monotonic() + self._timeout
        while pending:
            for c in list(pending):
                assert c.proc is not None
                if c.proc.poll() is not None:
                    raise ControlPlaneError(f"{c.name} exited with {c.proc.returncode}\n{self._tail(c.name)}")
                if c.health():
                    pending.remove(c)
                    self._mark(f"{c.name} healthy")
            if pending and time.monotonic() > deadline:
                c = pending[0]
                raise ControlPlaneError(
                    f"{c.name} not healthy after {self._timeout:.0f} s\n{self._tail(c.name)}"
                )
            if pending:
                time.sleep(0.2)

    def _wait_for(self, what: str, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self._timeout
        while not check():
            if time.monotonic() > deadline:
                tail = self._tail("kube-controller-manager")
                raise ControlPlaneError(f"{what} did not appear in {self._timeout:.0f} s\n{tail}")
            time.sleep(0.2)

    def _tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / f"{name}.log"
        text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
        return f"--- last lines of {path} ---\n" + "\n".join(text)

    def _write_state(self) -> None:
        state = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "pids": {c.name: c.proc.pid for c in self._components if c.proc is not None},
        }
        (self.work_dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    # -- API access ------------------------------------------------------------------------------

    def _admin_tls(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return ctx

    def _default_sa_exists(self) -> bool:
        return procs.http_ok(
            f"{self.server}/api/v1/namespaces/default/serviceaccounts/default", self._admin_tls()
        )

    def _write_kubeconfig(self, path: pathlib.Path, user: str) -> None:
        path.write_text(yaml.safe_dump(kubeconfig(self.server, self.pki, user)))
        path.chmod(0o600)


def kubeconfig(server: str, pki: pathlib.Path, user: str) -> dict[str, object]:
    """A self-contained kubeconfig (certificates inlined) for the client cert pki/<user>.crt."""

    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "plrl", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(f"{user}.crt"),
                    "client-key-data": b64(f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "plrl", "context": {"cluster": "plrl", "user": user}}],
        "current-context": "plrl",
    }


def _ours(pid: int, work_dir: str) -> bool:
    """The process still names work_dir on its command line or in its environment (the operator of
    `make cluster-up` finds its kubeconfig there), so a reused pid is never hit."""
    if procs.cmdline_mentions(pid, work_dir):
        return True
    try:
        return work_dir.encode() in pathlib.Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def stop_recorded(work_dir: pathlib.Path) -> list[str]:
    """Stops a detached control plane from its state file (`make cluster-down`), newest process first;
    returns what it stopped."""
    state_path = work_dir.resolve() / STATE_FILE
    if not state_path.exists():
        return []
    pids: dict[str, int] = json.loads(state_path.read_text())["pids"]
    stopped = []
    where = str(work_dir.resolve())
    for name, pid in reversed(list(pids.items())):
        if _ours(pid, where):
            procs.terminate(pid, functools.partial(lambda p: not _ours(p, where), pid))
            stopped.append(name)
    state_path.unlink()
    return stopped


__all__ = ["Cluster", "ControlPlane", "ControlPlaneError", "kubeconfig", "stop_recorded"]
