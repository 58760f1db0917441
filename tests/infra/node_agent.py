"""The node agent: plays kubelet for the fake GPU nodes (nodes.FAKE_NODE_LABEL).

It watches pods bound to those nodes, asks a PodRunner what each pod's containers are doing, and
writes that into the pod's status (phase, conditions, container states, pod IP). When a pod is being
deleted it stops it through the runner and removes the object once the runner says its containers are
gone, as a kubelet does within the grace period.

The seam is PodRunner, chosen per node by its `plrl.dev/runner` label (nodes.RUNNER_LABEL):
- `status` (StatusOnlyRunner, here, the default) reports every container Running and Ready at once,
  which is what scheduling and StatefulSet tests need;
- `process` (pod_runner.ProcessRunner) really runs each container's command as local processes in
  per-pod namespaces, and this agent then also serves the kubelet's log endpoint (pod_logs.py), so
  `kubectl logs` works on those pods.
A runner may poke the agent (`NodeAgent.poke`) when a pod's state changed, so the status follows at
once rather than at the next resync.

A fake node whose Ready condition is not True is down, as if the machine had lost power: the agent
kills its pods' containers (`PodRunner.power_off`) and then says nothing about them: no status
writes and no deletion is ever completed there (a pod deleted gracefully stays Terminating), until
someone force-deletes the pod. Tests take a node down by patching its Ready condition
(nodes.set_ready), as the node lifecycle controller would when its kubelet stops posting.

Run: python -m tests.infra.node_agent --kubeconfig K [--ready-file F] [--state-dir D --pki-dir P
--api-server URL] (controlplane.py does this).
Neighbours: nodes.py (the nodes), controlplane.py (starts this process and waits for --ready-file),
pod_runner.py and pod_logs.py (the process runner and its logs).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import ipaddress
import json
import logging
import os
import pathlib
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

import urllib3
from kubernetes import client, watch
from kubernetes.client import exceptions

from tests.infra import kube, nodes

log = logging.getLogger("node-agent")

Pod = dict[str, Any]  # a Pod as the API server sends it (JSON), never a client model
Phase = Literal["Pending", "Running", "Succeeded", "Failed"]
TERMINAL: frozenset[str] = frozenset({"Succeeded", "Failed"})
ON_A_NODE = "spec.nodeName!="
DEFAULT_RUNNER = "status"


@dataclasses.dataclass(frozen=True)
class ContainerState:
    name: str
    image: str
    state: Literal["waiting", "running", "terminated"]
    ready: bool
    exit_code: int = 0
    reason: str = ""
    restart_count: int = 0
    last_exit_code: int | None = None
    """Exit code of the previous run, reported as `lastState.terminated` (None: no previous run)."""
    last_reason: str = ""
    last_message: str = ""
    # What a runner that really runs containers knows; None: derived from the previous status and now.
    started_at: str | None = None
    finished_at: str | None = None
    message: str = ""
    """Of a waiting or terminated state (CrashLoopBackOff's back-off, a termination message)."""
    last_started_at: str | None = None
    last_finished_at: str | None = None
    started: bool | None = None
    """Past its startup probe (None: running means started)."""


@dataclasses.dataclass(frozen=True)
class PodState:
    """What a runner reports for one pod; the agent turns it into the pod's status."""

    phase: Phase
    pod_ip: str
    containers: tuple[ContainerState, ...]
    init_containers: tuple[ContainerState, ...] = ()
    message: str = ""


class PodRunner(Protocol):
    def sync(self, pod: Pod) -> PodState:
        """Starts the pod if this is the first call for its uid; reports its current state. Called on
        every change to the pod and every resync interval; must be cheap when nothing changed."""
        ...

    def stop(self, pod: Pod) -> bool:
        """Starts stopping the pod's containers (SIGTERM, SIGKILL after the grace period) without
        blocking; True once they are all gone. Idempotent: called again until it says True."""
        ...

    def power_off(self, pod: Pod) -> None:
        """The pod's node is down (not Ready): kill its containers at once, as a machine that lost
        power would; nothing is reported and the pod object is left as it was."""
        ...

    def close(self) -> None:
        """The agent is stopping: stop every pod, quickly, and release what the runner holds."""
        ...


class StatusOnlyRunner:
    """Runs nothing: every container is reported Running and Ready, init containers Completed.

    A pod annotated `CRASH_ANNOTATION: <exit code>` is reported as a kubelet reports a container
    that keeps exiting with that code: CrashLoopBackOff, one more restart every `crash_period_s`,
    the last run in `lastState.terminated`. That is how operator tests make a worker fail while
    this runner starts no processes.
    """

    # 198.18.0.0/15 is reserved for benchmarking (RFC 2544) and never routed. Pod IPs must not be
    # loopback (EndpointSlice validation refuses them); nothing ever connects to these.
    POD_NET = ipaddress.IPv4Network("198.18.0.0/15")
    CRASH_ANNOTATION = "plrl.test/crash-exit-code"

    def __init__(self, crash_period_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._crash_period_s = crash_period_s
        self._clock = clock
        self._crashing_since: dict[str, float] = {}  # pod uid -> when its crash loop started

    def _container(self, pod: Pod, c: dict[str, Any]) -> ContainerState:
        code = (pod["metadata"].get("annotations") or {}).get(self.CRASH_ANNOTATION)
        if code is None:
            return ContainerState(c["name"], c.get("image", ""), "running", True)
        since = self._crashing_since.setdefault(pod["metadata"]["uid"], self._clock())
        restarts = 1 + int((self._clock() - since) / self._crash_period_s)
        return ContainerState(
            c["name"],
            c.get("image", ""),
            "waiting",
            False,
            reason="CrashLoopBackOff",
            restart_count=restarts,
            last_exit_code=int(code),
            last_reason="Error",
            last_message=f"exited with code {code} ({self.CRASH_ANNOTATION})",
        )

    def sync(self, pod: Pod) -> PodState:
        spec = pod["spec"]
        ip = pod.get("status", {}).get("podIP") or self.pod_ip(pod["metadata"]["uid"])
        return PodState(
            phase="Running",
            pod_ip=ip,
            containers=tuple(self._container(pod, c) for c in spec["containers"]),
            init_containers=tuple(
                ContainerState(c["name"], c.get("image", ""), "terminated", False, 0, "Completed")
                for c in spec.get("initContainers") or []
            ),
        )

    def stop(self, pod: Pod) -> bool:
        self._crashing_since.pop(pod["metadata"]["uid"], None)
        return True

    def power_off(self, pod: Pod) -> None:
        pass  # nothing runs

    def close(self) -> None:
        self._crashing_since.clear()

    @classmethod
    def pod_ip(cls, uid: str) -> str:
        """A stable address derived from the uid, so an agent restart changes no pod's IP."""
        offset = int(uid.replace("-", ""), 16) % (cls.POD_NET.num_addresses - 2) + 1
        return str(cls.POD_NET.network_address + offset)


# -- pure status computation ---------------------------------------------------------------------


def pod_status(pod: Pod, state: PodState, host_ip: str, now: str) -> dict[str, Any]:
    """The status a kubelet would write for `state`; timestamps kept from `pod` where still true."""
    old = pod.get("status") or {}
    running = state.phase == "Running"
    ready = running and all(c.ready for c in state.containers)
    old_conds = {c["type"]: c for c in old.get("conditions") or []}

    def cond(kind: str, ok: bool) -> dict[str, Any]:
        status = "True" if ok else "False"
        prev = old_conds.get(kind)
        since = prev["lastTransitionTime"] if prev and prev.get("status") == status else now
        return {"type": kind, "status": status, "lastTransitionTime": since, "lastProbeTime": None}

    uid = pod["metadata"]["uid"]
    return {
        "phase": state.phase,
        "message": state.message or None,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": state.pod_ip or None,
        "podIPs": [{"ip": state.pod_ip}] if state.pod_ip else None,
        "startTime": old.get("startTime") or now,
        "conditions": [
            cond("PodReadyToStartContainers", bool(state.pod_ip)),  # the sandbox has its network
            cond("Initialized", all(c.state == "terminated" for c in state.init_containers)),
            cond("ContainersReady", ready),
            cond("Ready", ready),
        ],
        "containerStatuses": [
            _container_status(uid, c, old.get("containerStatuses"), now) for c in state.containers
        ],
        "initContainerStatuses": [
            _container_status(uid, c, old.get("initContainerStatuses"), now) for c in state.init_containers
        ],
    }


def _container_status(
    uid: str, c: ContainerState, old: list[dict[str, Any]] | None, now: str
) -> dict[str, Any]:
    prev_state = next((s.get("state") or {} for s in old or [] if s.get("name") == c.name), {})
    started = (
        c.started_at
        or (prev_state.get("running") or prev_state.get("terminated") or {}).get("startedAt")
        or now
    )
    if c.state == "running":
        state: dict[str, Any] = {"running": {"startedAt": started}}
    elif c.state == "terminated":
        finished = c.finished_at or (prev_state.get("terminated") or {}).get("finishedAt") or now
        term = {"exitCode": c.exit_code, "reason": c.reason, "startedAt": started, "finishedAt": finished}
        if c.message:
            term["message"] = c.message
        state = {"terminated": term}
    else:
        waiting = {"reason": c.reason or "ContainerCreating"}
        if c.message:
            waiting["message"] = c.message
        state = {"waiting": waiting}
    out: dict[str, Any] = {
        "name": c.name,
        "image": c.image,
        "imageID": "",
        "containerID": f"plrl://{uid}/{c.name}",
        "ready": c.ready,
        "started": c.state == "running" if c.started is None else c.started,
        "restartCount": c.restart_count,
        "state": state,
    }
    if c.last_exit_code is not None:
        out["lastState"] = {
            "terminated": {
                "exitCode": c.last_exit_code,
                "reason": c.last_reason,
                "message": c.last_message,
                "startedAt": c.last_started_at or started,
                "finishedAt": c.last_finished_at or now,
            }
        }
    return out


def summary(status: dict[str, Any] | None) -> tuple[Any, ...]:
    """What matters in a status, timestamps aside: a write is needed only when this changes."""
    s = status or {}

    def containers(key: str) -> tuple[Any, ...]:
        return tuple(
            (c.get("name"), tuple(sorted((c.get("state") or {}).keys())), c.get("ready"), c.get("started"),
             ((c.get("state") or {}).get("terminated") or {}).get("exitCode"), c.get("restartCount"),
             ((c.get("state") or {}).get("waiting") or {}).get("reason"),
             ((c.get("lastState") or {}).get("terminated") or {}).get("exitCode"))
            for c in s.get(key) or []
        )  # fmt: skip

    conds = tuple(
        sorted((c["type"], c["status"]) for c in s.get("conditions") or [] if c["type"] != "PodScheduled")
    )
    return (s.get("phase"), s.get("podIP"), s.get("hostIP"), conds, containers("containerStatuses"),
            containers("initContainerStatuses"))  # fmt: skip


# -- the agent -----------------------------------------------------------------------------------


class NodeAgent:
    def __init__(
        self,
        core: client.CoreV1Api,
        runners: Callable[[str], PodRunner | None],
        *,
        resync_s: float = 2.0,
        host_ip: str = "127.0.0.1",
        kubelet_port: int | None = None,
    ) -> None:
        """runners(name) -> the PodRunner for nodes labelled `plrl.dev/runner=name` (None: unknown,
        or unavailable here; their pods are left alone). kubelet_port: where this agent serves logs,
        written into each fake node's status.daemonEndpoints."""
        self._core = core
        self._runners = runners
        self._resync_s = resync_s
        self._host_ip = host_ip
        self._kubelet_port = kubelet_port
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        # uid -> latest version of every pod bound to a node; only those on fake nodes are acted on, and
        # a pod whose node is not yet known as fake is looked at again on the next resync.
        self._pods: dict[str, Pod] = {}
        self._fake_nodes: dict[str, str] = {}  # fake node -> its runner's name
        self._down: frozenset[str] = frozenset()  # fake nodes whose Ready condition is not True
        self._down_seen: frozenset[str] = frozenset()  # ... as last logged
        self._nodes_listed_at = 0.0
        self._used: dict[str, PodRunner] = {}
        self.synced = threading.Event()

    def poke(self, uid: str) -> None:
        """Reconcile pod `uid` soon (a runner saw its state change); thread-safe."""
        self._events.put(("POKE", uid))

    def run(self, stop: threading.Event) -> None:
        threading.Thread(target=self._watch, args=(stop,), name="pod-watch", daemon=True).start()
        while not stop.is_set():
            try:
                kind, obj = self._events.get(timeout=self._resync_s)
            except queue.Empty:
                self._list_nodes()
                for pod in list(self._pods.values()):
                    self._reconcile(pod)
                continue
            if time.monotonic() - self._nodes_listed_at > self._resync_s:
                self._list_nodes()  # a node that went down is noticed even while pods keep changing
                for pod in list(self._pods.values()):  # and its processes do not outlive it
                    if pod["spec"].get("nodeName") in self._down:
                        self._reconcile(pod)
            if kind == "LIST":
                self._on_list(obj)
                self.synced.set()
            elif kind == "POKE":
                if obj in self._pods:
                    self._reconcile(self._pods[obj])
            elif kind == "DELETED":
                gone = self._pods.pop(obj["metadata"]["uid"], None)
                if gone is not None:
                    self._stop(gone)
            else:
                self._pods[obj["metadata"]["uid"]] = obj
                self._reconcile(obj)
        for runner in self._used.values():
            runner.close()

    def _on_list(self, items: list[Pod]) -> None:
        fresh = {p["metadata"]["uid"]: p for p in items}
        for uid in self._pods.keys() - fresh.keys():
            self._stop(self._pods[uid])
        self._pods = fresh
        for pod in fresh.values():
            self._reconcile(pod)

    def _list_nodes(self) -> None:
        try:
            listed = self._core.list_node(label_selector=f"{nodes.FAKE_NODE_LABEL}=true")
        except (exceptions.ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            log.warning("nodes: %s", e)
            return
        self._nodes_listed_at = time.monotonic()
        named = [n for n in listed.items if n.metadata and n.metadata.name]
        self._fake_nodes = {
            n.metadata.name: (n.metadata.labels or {}).get(nodes.RUNNER_LABEL, DEFAULT_RUNNER) for n in named
        }
        down = frozenset(n.metadata.name for n in named if nodes.ready(n) != "True")
        self._down = down
        for name in down - self._down_seen:
            log.info("node %s: not Ready: its pods are powered off", name)
        self._down_seen = down
        for n in named:
            self._advertise(n)

    def _runner(self, node: str) -> PodRunner | None:
        # Relisted at most once a second: a burst of pods on a new node costs one list.
        if node and node not in self._fake_nodes and time.monotonic() - self._nodes_listed_at > 1.0:
            self._list_nodes()
        name = self._fake_nodes.get(node)
        if name is None:
            return None
        if name not in self._used:
            runner = self._runners(name)
            if runner is None:
                return None
            self._used[name] = runner
        return self._used[name]

    def _advertise(self, node: Any) -> None:
        """Point the API server's `kubectl logs` at this agent (the node's kubelet port)."""
        port = self._kubelet_port
        endpoints = node.status.daemon_endpoints if node.status else None
        current = endpoints.kubelet_endpoint.port if endpoints and endpoints.kubelet_endpoint else None
        if port is None or current == port:
            return
        body = {"status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}}
        try:
            self._core.patch_node_status(node.metadata.name, body)
        except exceptions.ApiException as e:
            log.warning("node %s: daemonEndpoints: %s %s", node.metadata.name, e.status, e.reason)

    def _stop(self, pod: Pod) -> bool:
        runner = self._used.get(self._fake_nodes.get(pod["spec"].get("nodeName", ""), ""))
        return True if runner is None else runner.stop(pod)

    def _reconcile(self, pod: Pod) -> None:
        meta = pod["metadata"]
        try:
            node = pod["spec"].get("nodeName", "")
            runner = self._runner(node)
            if runner is None:
                return
            if node in self._down:
                runner.power_off(pod)  # and nothing more: a node that is down reports nothing
                return
            if meta.get("deletionTimestamp"):
                if runner.stop(pod):  # the runner pokes us when it is done
                    self._delete(pod)
                return
            if (pod.get("status") or {}).get("phase") in TERMINAL:
                return
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            desired = pod_status(pod, runner.sync(pod), self._host_ip, now)
            if summary(desired) != summary(pod.get("status")):
                self._core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": desired})
                log.info("pod %s/%s: %s", meta["namespace"], meta["name"], desired["phase"])
        except exceptions.ApiException as e:
            if e.status not in (404, 409):
                log.warning("pod %s/%s: %s %s", meta["namespace"], meta["name"], e.status, e.reason)
        except (
            urllib3.exceptions.HTTPError,
            OSError,
        ) as e:  # the apiserver went away; the next resync retries
            log.warning("pod %s/%s: %s", meta["namespace"], meta["name"], e)

    def _delete(self, pod: Pod) -> None:
        meta = pod["metadata"]
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        self._core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)
        log.info("pod %s/%s: deleted", meta["namespace"], meta["name"])

    def _watch(self, stop: threading.Event) -> None:
        """List, then watch from the list's resourceVersion; relist when the watch expires or fails."""
        rv = None
        while not stop.is_set():
            try:
                if rv is None:
                    # Raw JSON, like the watch events: the agent works on dicts, not client models.
                    resp: Any = self._core.list_pod_for_all_namespaces(
                        field_selector=ON_A_NODE, _preload_content=False
                    )
                    listed = json.loads(resp.data)
                    rv = listed["metadata"]["resourceVersion"]
                    self._events.put(("LIST", listed["items"]))
                stream = watch.Watch().stream(
                    self._core.list_pod_for_all_namespaces,
                    field_selector=ON_A_NODE,
                    resource_version=rv,
                    timeout_seconds=60,
                    allow_watch_bookmarks=True,
                    deserialize=False,
                )
                for event in stream:
                    obj = event["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._events.put((event["type"], obj))
            except exceptions.ApiException as e:
                if e.status != 410:
                    log.warning("watch: %s %s", e.status, e.reason)
                    stop.wait(1.0)
                rv = None
            except (urllib3.exceptions.HTTPError, OSError) as e:
                log.warning("watch: %s", e)
                stop.wait(1.0)
                rv = None


def _runners(
    core: client.CoreV1Api, args: argparse.Namespace, agent: list[NodeAgent], log_sources: list[Any]
) -> Callable[[str], PodRunner | None]:
    """The runner factory: `status` always; `process` where this machine can run pods (else None,
    logged, and pods on such nodes stay Pending). `agent` holds the agent once it exists (the runner
    pokes it); a process runner is added to `log_sources` (what the log endpoint reads)."""

    def make(name: str) -> PodRunner | None:
        if name == "status":
            return StatusOnlyRunner()
        if name != "process":
            log.warning("unknown runner %r on a fake node: its pods are left alone", name)
            return None
        from tests.infra import pod_net, pod_runner  # root-only machinery, loaded on first use

        why = pod_net.available()
        if why is not None or args.state_dir is None or args.api_server is None:
            log.warning("process runner unavailable: %s", why or "--state-dir and --api-server are needed")
            return None
        api = urllib3.util.parse_url(args.api_server)
        cfg = pod_runner.RunnerConfig(
            state_dir=args.state_dir.resolve(),
            api_server=(str(api.host), int(api.port or 443)),
            image=pod_runner.local_image(os.environ.get("OMP_NUM_THREADS") or "1"),
            backoff_base_s=args.backoff_base_s,
            backoff_max_s=args.backoff_max_s,
        )
        runner = pod_runner.ProcessRunner(core, cfg, agent[0].poke)
        log_sources.append(runner)
        return runner

    return make


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", required=True, type=pathlib.Path)
    parser.add_argument("--ready-file", type=pathlib.Path, help="written once the first pod list is handled")
    parser.add_argument("--resync-s", type=float, default=2.0)
    parser.add_argument(
        "--state-dir", type=pathlib.Path, help="pods' runtime files and logs (process runner)"
    )
    parser.add_argument("--api-server", help="the API server's URL on this host (pods reach it at 10.0.0.1)")
    parser.add_argument(
        "--pki-dir",
        type=pathlib.Path,
        help="serve `kubectl logs` with these certificates (controlplane.py's)",
    )
    parser.add_argument("--backoff-base-s", type=float, default=10.0, help="CrashLoopBackOff's first delay")
    parser.add_argument("--backoff-max-s", type=float, default=300.0, help="CrashLoopBackOff's longest delay")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    api = kube.api_client(args.kubeconfig)
    core = client.CoreV1Api(api)
    port = None
    log_sources: list[Any] = []
    if args.pki_dir is not None:
        from tests.infra import pod_logs

        port = pod_logs.serve(args.pki_dir, log_sources)
    holder: list[NodeAgent] = []
    runners = _runners(core, args, holder, log_sources)
    agent = NodeAgent(core, runners, resync_s=args.resync_s, kubelet_port=port)
    holder.append(agent)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.ready_file:

        def mark_ready() -> None:
            while not stop.is_set() and not agent.synced.wait(0.5):
                pass
            if agent.synced.is_set():
                args.ready_file.write_text("ready\n")

        threading.Thread(target=mark_ready, daemon=True).start()
    agent.run(stop)
    log.info("stopped")


if __name__ == "__main__":
    main()
