"""The process runner against the real control plane: pods on `plrl.dev/runner=process` nodes run.

Cases: a pod gets what a kubelet gives it (init container first, env from values, the downward API,
a Secret and a ConfigMap, the ConfigMap volume at its mountPath, a memory emptyDir shared with the init
container, its own hostname and a non-loopback pod IP, PID 1, the ServiceAccount token that the API
server at $KUBERNETES_SERVICE_HOST authenticates as the pod's ServiceAccount) and `kubectl logs` shows
its output; two pods reach each other by their pod DNS names, and a readiness probe holds Ready off
until the server listens; an exec readiness probe runs inside the container, a failing liveness probe
restarts it; a crash-looping container is restarted with back-off (restartCount, exit code
and log lines in lastState, CrashLoopBackOff, `kubectl logs --previous`), a command that does not exist
is a StartError, restartPolicy Never ends Failed or Succeeded; a pod whose claim is not there yet waits
(ContainerCreating, a FailedMount event) and then writes through it (subPath); deleting a pod whose
process ignores SIGTERM and leaves children and a daemon behind stops the whole tree within the grace
period; killing the node agent itself leaves no container process behind and the next agent removes
its bridge.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import psutil
import pytest
import yaml

from tests.infra import binaries, controlplane, nodes, tools
from tests.operator.cluster.support import eventually

SCRIPTS = {
    "report.py": """
import json, os, pathlib, socket, ssl, urllib.request
sa = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
review = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
req = urllib.request.Request(
    f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews", data=review, method="POST",
    headers={"Authorization": "Bearer " + (sa / "token").read_text(), "Content-Type": "application/json"})
ctx = ssl.create_default_context(cafile=str(sa / "ca.crt"))
who = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["status"]["userInfo"]["username"]
print(json.dumps({
    "env": {k: os.environ.get(k) for k in ("POD", "INDEX", "TOKEN", "LEVEL", "GREETING", "OMP_NUM_THREADS")},
    "config": open("/etc/plrl/level").read(), "shm": open("/dev/shm/from-init").read(),
    "hostname": socket.gethostname(), "ip": socket.gethostbyname(socket.gethostname()),
    "pid": os.getpid(), "who": who, "namespace": (sa / "namespace").read_text(),
}), flush=True)
""",
    "serve.py": """
import http.server, time
time.sleep(2)  # not ready at first: the readiness probe must hold Ready off
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"hello from " + self.path.encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
""",
    "ask.py": """
import sys, time, urllib.request
for _ in range(100):
    try:
        print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode(), flush=True); break
    except OSError as err:
        time.sleep(0.3)
""",
    "crash.py": """
import sys
print("attempt output, exiting with", sys.argv[1], flush=True)
sys.exit(int(sys.argv[1]))
""",
    "stubborn.py": """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
marker = sys.argv[1]
subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(3600)  # {marker} child"])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        code = f"import signal, time; signal.signal(15, signal.SIG_IGN); time.sleep(3600)  # {marker} daemon"
        os.execv(sys.executable, [sys.executable, "-c", code])
    os._exit(0)
print("ready", flush=True)
while True:
    time.sleep(1)
""",
}


INDEX_LABEL = "metadata.labels['apps.kubernetes.io/pod-index']"


def _apply(kubectl: tools.Tool, ns: str, *docs: dict[str, Any]) -> None:
    kubectl("apply", "-n", ns, "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))


def _scripts(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "scripts", "namespace": ns},
        "data": SCRIPTS,
    }


def _pod(name: str, node: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    volumes = [{"name": "scripts", "configMap": {"name": "scripts"}}, *spec.pop("volumes", [])]
    for c in containers:
        c.setdefault("image", "plrl/test:0")
        c["volumeMounts"] = [{"name": "scripts", "mountPath": "/scripts"}, *c.get("volumeMounts", [])]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {})},
        "spec": {
            "nodeName": node,
            "containers": list(containers),
            "volumes": volumes,
            "terminationGracePeriodSeconds": 5,
            **spec,
        },
    }


def _get(kubectl: tools.Tool, ns: str, name: str) -> dict[str, Any]:
    out = kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
    return dict(json.loads(out.stdout)) if out.returncode == 0 else {}


def _container(pod: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return next((c for c in statuses if name is None or c.get("name") == name), {})


def _marked(marker: str) -> list[str]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if marker in cmd and "pytest" not in cmd:
            found.append(cmd)
    return found


@pytest.fixture
def node(gpu_nodes: Callable[..., nodes.Pool]) -> str:
    from tests.infra import pod_net

    why = pod_net.available()
    if why is not None:
        pytest.skip(f"pods cannot run on this machine: {why}")
    return gpu_nodes(1, runner="process").nodes[0]


def test_a_pod_gets_what_a_kubelet_gives_it(kubectl: tools.Tool, namespace: str, node: str) -> None:
    _apply(
        kubectl,
        namespace,
        _scripts(namespace),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "tok"},
            "stringData": {"token": "s3cret"},
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"level": "debug"}},
    )
    shm = {"name": "dshm", "mountPath": "/dev/shm"}
    pod = _pod(
        "reporter-0",
        node,
        {
            "name": "main",
            "command": ["python", "/scripts/report.py"],
            "env": [
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "INDEX", "valueFrom": {"fieldRef": {"fieldPath": INDEX_LABEL}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}},
                {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "level"}}},
                {"name": "GREETING", "value": "hi $(POD)"},
            ],
            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/plrl", "readOnly": True}, shm],
        },
        initContainers=[
            {
                "name": "init",
                "image": "busybox",
                "command": ["sh", "-c", "echo seeded > /dev/shm/from-init"],
                "volumeMounts": [shm],
            }
        ],
        volumes=[
            {"name": "cfg", "configMap": {"name": "cfg"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
        labels={"apps.kubernetes.io/pod-index": "3"},
        restartPolicy="Never",
    )
    _apply(kubectl, namespace, pod)
    done = eventually(
        lambda: (
            (p := _get(kubectl, namespace, "reporter-0")).get("status", {}).get("phase")
            in ("Succeeded", "Failed")
            and p
        ),
        60,
        "reporter-0 to finish",
    )
    logs = kubectl("logs", "reporter-0", "-n", namespace, "-c", "main").stdout
    assert done["status"]["phase"] == "Succeeded", logs
    report = json.loads(logs.strip().splitlines()[-1])
    assert report["env"] == {
        "POD": "reporter-0",
        "INDEX": "3",
        "TOKEN": "s3cret",
        "LEVEL": "debug",
        "GREETING": "hi reporter-0",
        "OMP_NUM_THREADS": "1",
    }
    assert report["config"] == "debug" and report["shm"] == "seeded\n"
    assert report["hostname"] == "reporter-0" and report["pid"] == 1
    assert report["ip"] == done["status"]["podIP"] and report["ip"].startswith("198.1")
    assert report["who"] == f"system:serviceaccount:{namespace}:default"
    assert report["namespace"] == namespace
    init = done["status"]["initContainerStatuses"][0]
    assert init["state"]["terminated"]["reason"] == "Completed"
    assert not pathlib.Path("/etc/plrl").exists(), "mount points must not leak onto the host"


def test_peers_reach_each_other_by_pod_dns_names(kubectl: tools.Tool, namespace: str, node: str) -> None:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "srv"},
        "spec": {"clusterIP": "None", "selector": {"app": "srv"}, "ports": [{"port": 8080}]},
    }
    server = _pod(
        "srv-0",
        node,
        {
            "name": "main",
            "command": ["python", "/scripts/serve.py"],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1},
        },
        hostname="srv-0",
        subdomain="srv",
        labels={"app": "srv"},
    )
    _apply(kubectl, namespace, _scripts(namespace), svc, server)
    eventually(lambda: _get(kubectl, namespace, "srv-0").get("status", {}).get("podIP"), 30, "srv-0's IP")
    assert not _container(_get(kubectl, namespace, "srv-0")).get("ready"), "ready before it listens"
    eventually(lambda: _container(_get(kubectl, namespace, "srv-0")).get("ready"), 30, "srv-0 Ready (probe)")
    url = f"http://srv-0.srv.{namespace}.svc:8080/from-client"
    client = _pod(
        "client", node, {"name": "main", "command": ["python", "/scripts/ask.py", url]}, restartPolicy="Never"
    )
    _apply(kubectl, namespace, client)
    eventually(
        lambda: _get(kubectl, namespace, "client").get("status", {}).get("phase") == "Succeeded",
        60,
        "client done",
    )
    assert kubectl("logs", "client", "-n", namespace).stdout.strip() == "hello from /from-client"


def test_exec_readiness_and_a_failing_liveness_probe(kubectl: tools.Tool, namespace: str, node: str) -> None:
    ready_later = _pod(
        "ready-later",
        node,
        {
            "name": "main",
            "command": ["sh", "-c", "sleep 1; touch /tmp/ready; exec sleep 3600"],
            "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/ready"]}, "periodSeconds": 1},
        },
    )
    unhealthy = _pod(
        "unhealthy",
        node,
        {
            "name": "main",
            "command": ["sleep", "3600"],
            "livenessProbe": {"tcpSocket": {"port": 9999}, "periodSeconds": 1, "failureThreshold": 2},
        },
        terminationGracePeriodSeconds=1,
    )
    _apply(kubectl, namespace, _scripts(namespace), ready_later, unhealthy)
    eventually(
        lambda: _container(_get(kubectl, namespace, "ready-later")).get("ready"), 30, "Ready (exec probe)"
    )
    c = eventually(
        lambda: (c := _container(_get(kubectl, namespace, "unhealthy"))).get("restartCount", 0) >= 1 and c,
        30,
        "a restart after the liveness probe failed",
    )
    assert c["lastState"]["terminated"]["exitCode"] == 137  # sleep as PID 1 ignores SIGTERM: killed
    events = kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=unhealthy"
    ).stdout
    assert "Unhealthy" in events


def test_crash_loops_restart_with_back_off(kubectl: tools.Tool, namespace: str, node: str) -> None:
    crash = _pod(
        "crashy",
        node,
        {
            "name": "main",
            "command": ["python", "/scripts/crash.py", "3"],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        },
    )
    missing = _pod("missing", node, {"name": "main", "command": ["no-such-binary"]}, restartPolicy="Never")
    once = _pod(
        "once", node, {"name": "main", "command": ["python", "/scripts/crash.py", "0"]}, restartPolicy="Never"
    )
    _apply(kubectl, namespace, _scripts(namespace), crash, missing, once)

    c = eventually(
        lambda: (c := _container(_get(kubectl, namespace, "crashy"))).get("restartCount", 0) >= 3 and c,
        60,
        "3 restarts",
    )
    last = c["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) == (3, "Error")
    assert "attempt output, exiting with 3" in last["message"]
    waiting = eventually(
        lambda: (_container(_get(kubectl, namespace, "crashy")).get("state") or {}).get("waiting"),
        30,
        "back-off",
    )
    assert waiting["reason"] == "CrashLoopBackOff" and "back-off" in waiting["message"]
    previous = kubectl("logs", "crashy", "-n", namespace, "--previous").stdout
    assert previous.strip() == "attempt output, exiting with 3"
    events = kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=crashy"
    ).stdout
    assert "BackOff" in events and "Started" in events

    gone = eventually(
        lambda: (p := _get(kubectl, namespace, "missing"))["status"]["phase"] == "Failed" and p, 30, "Failed"
    )
    term = _container(gone)["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (128, "StartError")
    assert term["message"] == 'exec: "no-such-binary": executable file not found in $PATH'
    eventually(
        lambda: _get(kubectl, namespace, "once")["status"]["phase"] == "Succeeded", 30, "once Succeeded"
    )


def test_a_pod_waits_for_its_claim_then_writes_through_it(
    kubectl: tools.Tool, namespace: str, node: str, tmp_path: pathlib.Path
) -> None:
    pod = _pod(
        "writer",
        node,
        {
            "name": "main",
            "command": ["sh", "-c", "echo from-the-pod > /data/file"],
            "volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": "run1"}],
        },
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "later"}}],
        restartPolicy="Never",
    )
    _apply(kubectl, namespace, _scripts(namespace), pod)

    def failed_mount() -> str:
        out = kubectl("get", "events", "-n", namespace, "--field-selector", "reason=FailedMount").stdout
        return out if 'persistentvolumeclaim "later" not found' in out else ""

    eventually(failed_mount, 30, "a FailedMount event")
    waiting = _container(_get(kubectl, namespace, "writer"))["state"]["waiting"]
    assert waiting["reason"] == "ContainerCreating"
    pv = f"{namespace}-later"
    _apply(
        kubectl,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "hostPath": {"path": str(tmp_path / "pv")},
                "claimRef": {"namespace": namespace, "name": "later"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "later"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "",
                "volumeName": pv,
            },
        },
    )
    try:
        eventually(
            lambda: _get(kubectl, namespace, "writer")["status"]["phase"] == "Succeeded", 60, "writer done"
        )
        assert (tmp_path / "pv" / "run1" / "file").read_text() == "from-the-pod\n"
    finally:
        kubectl("delete", "pv", pv, "--wait=false", check=False)


def test_deletion_stops_the_whole_process_tree_within_the_grace_period(
    kubectl: tools.Tool, namespace: str, node: str
) -> None:
    marker = f"plrl-stubborn-{uuid.uuid4().hex[:8]}"
    pod = _pod(
        "stubborn",
        node,
        {"name": "main", "command": ["python", "/scripts/stubborn.py", marker]},
        terminationGracePeriodSeconds=3,
    )
    _apply(kubectl, namespace, _scripts(namespace), pod)
    eventually(lambda: len(_marked(marker)) >= 3, 60, "the process, its child and its daemon")
    started = time.monotonic()
    kubectl("delete", "pod", "stubborn", "-n", namespace, "--wait=true", "--timeout=30s")
    took = time.monotonic() - started
    assert 2.5 < took < 10, f"deleted after {took:.1f} s; the grace period is 3 s and SIGTERM is ignored"
    assert not _marked(marker), "every process of the container dies with it"


@pytest.mark.cluster  # its own control plane: it needs the built binary like the fixture's users
def test_killing_the_node_agent_leaves_nothing_running(tmp_path: pathlib.Path) -> None:
    """A private control plane (this test kills its node agent)."""
    from kubernetes import client

    from tests.infra import kube, pod_net

    if pod_net.available() is not None:
        pytest.skip(f"pods cannot run on this machine: {pod_net.available()}")
    marker = f"plrl-orphan-{uuid.uuid4().hex[:8]}"
    with controlplane.ControlPlane(tmp_path / "cp").start() as cp:
        kubectl = tools.bind(binaries.kubectl(), cp.kubeconfig)
        core = client.CoreV1Api(kube.api_client(cp.kubeconfig))
        nodes.create(core, [nodes.GpuNode(name="gpu-orphans-0", runner="process")])
        _apply(
            kubectl,
            "default",
            _scripts("default"),
            _pod(
                "stubborn",
                "gpu-orphans-0",
                {"name": "main", "command": ["python", "/scripts/stubborn.py", marker]},
            ),
        )
        eventually(lambda: len(_marked(marker)) >= 3, 60, "the process tree")
        agent = next(c for c in cp._components if c.name == "node-agent")
        assert agent.proc is not None
        mine = [name for name, pid in pod_net.bridges().items() if pid == agent.proc.pid]
        assert len(mine) == 1, pod_net.bridges()
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait()
        eventually(lambda: not _marked(marker), 10, "every container process to die with the agent")
        pod_net.Bridge.create().close()  # the next agent's start-up removes the dead agent's bridge
        assert mine[0] not in pod_net.bridges()
