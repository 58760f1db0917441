"""The node agent: plays kubelet for the fake GPU nodes (nodes.FAKE_NODE_LABEL).

It watches pods bound to those nodes, asks a PodRunner what each pod's containers are doing, and
writes that into the pod's status (phase, conditions, container states, pod IP). When a pod is being
deleted it stops it through the runner and removes the object, as a kubelet does after the grace period.

The seam is PodRunner: StatusOnlyRunner (here) reports every container Running and Ready at once,
which is what scheduling and StatefulSet tests need. A runner that really starts each container's
command as a local process implements the same two methods: `sync` starts on first sight and reports
exits on later calls (the agent calls it again every resync interval), `stop` kills.

Run: python -m tests.infra.node_agent --kubeconfig K [--ready-file F] [--runner status]
(controlplane.py does this; a new runner registers in RUNNERS, chosen by ControlPlane(node_runner=...)).
Neighbours: nodes.py (the nodes), controlplane.py (starts this process and waits for --ready-file).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import ipaddress
import json
import logging
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

    def stop(self, pod: Pod) -> None:
        """Stops the pod's containers; idempotent; called when the pod is being deleted or is gone."""
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

    def stop(self, pod: Pod) -> None:
        self._crashing_since.pop(pod["metadata"]["uid"], None)

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
        "podIP": state.pod_ip,
        "podIPs": [{"ip": state.pod_ip}],
        "startTime": old.get("startTime") or now,
        "conditions": [
            cond("PodReadyToStartContainers", True),
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
    started = (prev_state.get("running") or prev_state.get("terminated") or {}).get("startedAt") or now
    if c.state == "running":
        state: dict[str, Any] = {"running": {"startedAt": started}}
    elif c.state == "terminated":
        finished = (prev_state.get("terminated") or {}).get("finishedAt") or now
        term = {"exitCode": c.exit_code, "reason": c.reason, "startedAt": started, "finishedAt": finished}
        state = {"terminated": term}
    else:
        state = {"waiting": {"reason": c.reason or "ContainerCreating"}}
    out: dict[str, Any] = {
        "name": c.name,
        "image": c.image,
        "imageID": "",
        "containerID": f"plrl://{uid}/{c.name}",
        "ready": c.ready,
        "started": c.state == "running",
        "restartCount": c.restart_count,
        "state": state,
    }
    if c.last_exit_code is not None:
        out["lastState"] = {
            "terminated": {
                "exitCode": c.last_exit_code,
                "reason": c.last_reason,
                "message": c.last_message,
                "startedAt": started,
                "finishedAt": now,
            }
        }
    return out


def summary(status: dict[str, Any] | None) -> tuple[Any, ...]:
    """What matters in a status, timestamps aside: a write is needed only when this changes."""
    s = status or {}

    def containers(key: str) -> tuple[Any, ...]:
        return tuple(
            (c.get("name"), tuple(sorted((c.get("state") or {}).keys())), c.get("ready"),
             ((c.get("state") or {}).get("terminated") or {}).get("exitCode"), c.get("restartCount"))
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
        self, core: client.CoreV1Api, runner: PodRunner, *, resync_s: float = 2.0, host_ip: str = "127.0.0.1"
    ) -> None:
        self._core = core
        self._runner = runner
        self._resync_s = resync_s
        self._host_ip = host_ip
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        # uid -> latest version of every pod bound to a node; only those on fake nodes are acted on, and
        # a pod whose node is not yet known as fake is looked at again on the next resync.
        self._pods: dict[str, Pod] = {}
        self._fake_nodes: set[str] = set()
        self._nodes_listed_at = 0.0
        self.synced = threading.Event()

    def run(self, stop: threading.Event) -> None:
        threading.Thread(target=self._watch, args=(stop,), name="pod-watch", daemon=True).start()
        while not stop.is_set():
            try:
                kind, obj = self._events.get(timeout=self._resync_s)
            except queue.Empty:
                for pod in list(self._pods.values()):
                    self._reconcile(pod)
                continue
            if kind == "LIST":
                self._on_list(obj)
                self.synced.set()
            elif kind == "DELETED":
                gone = self._pods.pop(obj["metadata"]["uid"], None)
                if gone is not None:
                    self._runner.stop(gone)
            else:
                self._pods[obj["metadata"]["uid"]] = obj
                self._reconcile(obj)
        for pod in self._pods.values():
            self._runner.stop(pod)

    def _on_list(self, items: list[Pod]) -> None:
        fresh = {p["metadata"]["uid"]: p for p in items}
        for uid in self._pods.keys() - fresh.keys():
            self._runner.stop(self._pods[uid])
        self._pods = fresh
        for pod in fresh.values():
            self._reconcile(pod)

    def _is_fake(self, node: str) -> bool:
        # Relisted at most once a second: a burst of pods on a new node costs one list.
        if node and node not in self._fake_nodes and time.monotonic() - self._nodes_listed_at > 1.0:
            listed = self._core.list_node(label_selector=f"{nodes.FAKE_NODE_LABEL}=true")
            self._fake_nodes = {n.metadata.name for n in listed.items if n.metadata and n.metadata.name}
            self._nodes_listed_at = time.monotonic()
        return node in self._fake_nodes

    def _reconcile(self, pod: Pod) -> None:
        meta = pod["metadata"]
        try:
            if not self._is_fake(pod["spec"].get("nodeName", "")):
                return
            if meta.get("deletionTimestamp"):
                self._runner.stop(pod)
                self._delete(pod)
                return
            if (pod.get("status") or {}).get("phase") in TERMINAL:
                return
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            desired = pod_status(pod, self._runner.sync(pod), self._host_ip, now)
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


# --runner NAME -> a factory given the agent's API client (a process runner reads ConfigMaps/Secrets).
RUNNERS: dict[str, Callable[[client.CoreV1Api], PodRunner]] = {"status": lambda core: StatusOnlyRunner()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", required=True, type=pathlib.Path)
    parser.add_argument("--ready-file", type=pathlib.Path, help="written once the first pod list is handled")
    parser.add_argument("--resync-s", type=float, default=2.0)
    parser.add_argument("--runner", choices=sorted(RUNNERS), default="status", help="how pods are run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    api = kube.api_client(args.kubeconfig)
    core = client.CoreV1Api(api)
    agent = NodeAgent(core, RUNNERS[args.runner](core), resync_s=args.resync_s)
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
