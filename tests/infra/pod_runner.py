"""ProcessRunner: the node agent's PodRunner that really runs pods, as local processes.

For every pod bound to a fake node labelled `plrl.dev/runner=process` it does what a kubelet and its
container runtime do, on this machine and from the project's own environment (the image name is
recorded, never pulled: every image runs `LOCAL_IMAGE`, the venv's interpreter first on PATH):

1. volumes (pod_fs): ConfigMap, Secret, projected (the ServiceAccount token from the TokenRequest API,
   bound to the pod, refreshed at 80% of its life; kube-root-ca.crt; the namespace), downwardAPI,
   emptyDir (medium Memory: tmpfs), PersistentVolumeClaims through their bound hostPath/local
   PersistentVolume, hostPath; a claim that is not bound yet keeps the pod in ContainerCreating;
2. the sandbox (pod_shim sandbox, pod_net): network, UTS, IPC and mount namespaces, the pod's address
   on the agent's bridge, /etc/hosts naming its peers, the API server at 10.0.0.1:443;
3. init containers one by one, then every container (pod_shim container): its env and command line
   (pod_env), its mounts at their mountPaths, stdout and stderr to
   `<state>/logs/<ns>_<pod>_<uid>/<container>/<restartCount>.log` (what `kubectl logs` serves);
4. exits: restartPolicy with the kubelet's back-off (pod_lifecycle), exit codes, reasons,
   termination messages, restartCount and lastState in the status; probes (pod_probe) for
   readiness, liveness and startup;
5. deletion: SIGTERM to every container, SIGKILL once the grace period is over, then the sandbox
   goes (its namespaces, veth and tmpfs with it), and only then is the pod object removed.

Each pod has one worker thread that owns all of its processes (a process's PR_SET_PDEATHSIG follows
the thread that started it, and this thread lives until they are gone). `sync` and `stop` only read
or flag the worker, so the agent's loop never blocks; the worker pokes the agent (`notify`) whenever
what it would report changed.

Neighbours: node_agent.py (the agent; `ContainerState`/`PodState` are its types), pod_api.py (what it
reads from the API server), pod_shim.py, pod_net.py, pod_fs.py, pod_env.py, pod_probe.py,
pod_lifecycle.py, pod_logs.py (serves the logs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client import exceptions

from tests.infra import node_agent, pod_api, pod_env, pod_fs, pod_lifecycle, pod_net, pod_probe, pod_shim

log = logging.getLogger("node-agent.runner")

Pod = dict[str, Any]
REPO = pathlib.Path(__file__).resolve().parents[2]
TICK_S = 0.1
RETRY_S = 2.0
TOKEN_REFRESH = 0.8  # of a token's lifetime, as the kubelet
SERVICE_IP, SERVICE_PORT = "10.0.0.1", 443


def local_image(omp_threads: str) -> pod_env.Image:
    """The one image every container runs: this venv, with the worker image's ENV
    (dockerfiles/worker.Dockerfile) and one OpenMP thread (the machine's cores are shared by every pod)."""
    bin_dir = pathlib.Path(sys.executable).parent
    return pod_env.Image(
        env={
            "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "PYTHONUNBUFFERED": "1",
            "HF_HOME": "/tmp/hf",
            "OMP_NUM_THREADS": omp_threads,
        }
    )


@dataclasses.dataclass(frozen=True)
class RunnerConfig:
    state_dir: pathlib.Path
    api_server: tuple[str, int]
    """The API server as the host reaches it (pods reach it at 10.0.0.1:443 through a forwarder)."""
    image: pod_env.Image
    host_ip: str = "127.0.0.1"
    backoff_base_s: float = 10.0
    backoff_max_s: float = 300.0
    shutdown_grace_s: float = 3.0
    """The grace period containers get when the agent itself stops."""


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass
class Run:
    """One container of a pod and its current (or last) run."""

    spec: dict[str, Any]
    init: bool
    state: pod_lifecycle.ContainerPhase = "waiting"
    reason: str = "ContainerCreating"
    message: str = ""
    exit_code: int = 0
    started_at: str | None = None
    finished_at: str | None = None
    restart_count: int = 0
    last: tuple[pod_lifecycle.Termination, str, str] | None = None
    """The termination before the current state, with its start and finish times."""
    proc: subprocess.Popen[bytes] | None = None
    ever_started: bool = False
    done: bool = False
    """Terminated for good (no restart will follow)."""
    failures: int = 0
    next_start: float = 0.0
    run_started: float = 0.0
    kill_at: float | None = None
    probes: dict[str, pod_probe.Prober] = dataclasses.field(default_factory=dict)
    ready: bool = False

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def status(self) -> node_agent.ContainerState:
        last = self.last
        return node_agent.ContainerState(
            name=self.name,
            image=str(self.spec.get("image", "")),
            state=self.state,
            ready=self.ready,
            exit_code=self.exit_code,
            reason=self.reason if self.state != "running" else "",
            restart_count=self.restart_count,
            last_exit_code=last[0].exit_code if last else None,
            last_reason=last[0].reason if last else "",
            last_message=last[0].message if last else "",
            started_at=self.started_at,
            finished_at=self.finished_at,
            message=self.message,
            last_started_at=last[1] if last else None,
            last_finished_at=last[2] if last else None,
            started=self.state == "running"
            and ("startup" not in self.probes or self.probes["startup"].passing),
        )


class PodWorker:
    """Everything about one pod, run by its own thread (see the module docstring)."""

    def __init__(self, runner: ProcessRunner, pod: Pod) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        self.runner, self.pod = runner, pod
        self.uid, self.ns, self.name = meta["uid"], meta["namespace"], meta["name"]
        cfg = runner.cfg
        self.dir = cfg.state_dir / "pods" / self.uid
        self.log_dir = cfg.state_dir / "logs" / f"{self.ns}_{self.name}_{self.uid}"
        self.policy: pod_lifecycle.RestartPolicy = spec.get("restartPolicy") or "Always"
        self.inits = [Run(c, True, reason="PodInitializing") for c in spec.get("initContainers") or []]
        self.containers = [
            Run(c, False, reason="PodInitializing" if self.inits else "ContainerCreating")
            for c in spec.get("containers") or []
        ]
        self.pod_ip = ""
        self.message = ""
        self.init_failed = False
        self.sandbox: subprocess.Popen[bytes] | None = None
        self.sandbox_pid = 0
        self.forwarder: pod_net.Forwarder | None = None
        self.volumes = pod_fs.VolumePlan()
        self.files: pod_fs.PodFiles | None = None
        self.allocatable: dict[str, str] = {}
        self.token_due: dict[pathlib.Path, float] = {}
        self.lock = threading.Lock()
        self.grace_s: float | None = None
        self.kill_after: float | None = None
        self.finished = threading.Event()
        self._reported: tuple[Any, ...] = ()
        self.thread = threading.Thread(target=self._main, name=f"pod-{self.ns}-{self.name}", daemon=True)

    # -------------------------------------------------------------- what the agent sees

    def snapshot(self) -> node_agent.PodState:
        with self.lock:
            inits = [r.status() for r in self.inits]
            conts = [r.status() for r in self.containers]
            phase = pod_lifecycle.pod_phase(
                [self._seen(r) for r in self.inits],
                [self._seen(r) for r in self.containers],
                self.init_failed,
            )
            return node_agent.PodState(
                phase=phase,  # type: ignore[arg-type]
                pod_ip=self.pod_ip,
                containers=tuple(conts),
                init_containers=tuple(inits),
                message=self.message,
            )

    @staticmethod
    def _seen(r: Run) -> pod_lifecycle.Seen:
        return pod_lifecycle.Seen(
            r.state, r.ever_started, r.exit_code if r.state == "terminated" else None, restarting=not r.done
        )

    def terminate(self, grace_s: float) -> None:
        with self.lock:
            if self.grace_s is None or grace_s < self.grace_s:
                self.grace_s = grace_s

    def power_off(self) -> None:
        """The machine is gone: every process dies at once, with no SIGTERM first."""
        with self.lock:
            self.grace_s = 0.0
            if self.kill_after is None:
                self.kill_after = 0.0

    def _changed(self) -> None:
        state = self.snapshot()
        key = (state.phase, state.pod_ip, state.containers, state.init_containers, state.message)
        if key != self._reported:
            self._reported = key
            self.runner.notify(self.uid)

    def _event(self, run: Run | None, kind: str, reason: str, message: str) -> None:
        self.runner.lookups.event(self.pod, run.name if run else None, kind, reason, message)

    # -------------------------------------------------------------- the thread

    def _main(self) -> None:
        try:
            if self._setup():
                self._loop()
        except Exception as err:  # a bug here must show in the pod, not vanish with the thread
            log.exception("pod %s/%s: runner failed", self.ns, self.name)
            with self.lock:
                self.message = f"node agent: {type(err).__name__}: {err}"
        finally:
            self._kill_all(force=True)
            self._teardown()
            self.finished.set()
            self.runner.notify(self.uid)

    def _stopping(self) -> bool:
        with self.lock:
            return self.grace_s is not None

    def _setup(self) -> bool:
        """Volumes, sandbox, network. Retries what may fix itself (an unbound claim); False if the pod
        was deleted first."""
        facts = pod_env.PodFacts(pod_ip="", host_ip=self.runner.cfg.host_ip)
        reported = ""
        while True:
            if self._stopping():
                return False
            try:
                self.allocatable = self.runner.lookups.allocatable(self.pod["spec"]["nodeName"])
                self.volumes = pod_fs.plan_volumes(self.pod, self.dir, self.runner.lookups, facts)
                break
            except (pod_fs.VolumeError, pod_env.EnvError) as err:
                if str(err) != reported:  # as a kubelet: an event, and the pod stays ContainerCreating
                    reported = str(err)
                    self._event(None, "Warning", "FailedMount", f"MountVolume.SetUp failed: {err}")
            except exceptions.ApiException as err:
                log.warning("pod %s/%s: %s %s", self.ns, self.name, err.status, err.reason)
            time.sleep(RETRY_S)
        pod_fs.write(self.volumes)
        now = time.monotonic()
        for t in self.volumes.tokens:
            self.token_due[t.path] = now + TOKEN_REFRESH * t.expiration_seconds
        self._start_sandbox()
        return True

    def _start_sandbox(self) -> None:
        spec = self.pod["spec"]
        hostname = (spec.get("hostname") or self.name)[:63]
        etc = self.dir / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        self.files = pod_fs.PodFiles(etc / "hosts", etc / "hostname", etc / "resolv.conf")
        self.files.hostname.write_text(hostname + "\n")
        self.files.resolv_conf.write_text(pod_net.resolv_conf(self.ns))
        plan = pod_shim.dump(
            pod_shim.SandboxPlan(hostname, os.getpid(), tuple(str(d) for d in self.volumes.tmpfs)),
            self.dir / "sandbox.json",
        )
        self.sandbox = subprocess.Popen(
            [sys.executable, "-m", "tests.infra.pod_shim", "sandbox", str(plan)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(self.dir / "sandbox.log").open("wb"),
            cwd=REPO,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)},
            start_new_session=True,
        )
        assert self.sandbox.stdout is not None
        line = self.sandbox.stdout.readline()
        if not line.strip():
            raise RuntimeError(f"sandbox failed: {(self.dir / 'sandbox.log').read_text(errors='replace')}")
        self.sandbox_pid = int(line)
        bridge = self.runner.bridge()
        ip = bridge.attach(self.uid, self.sandbox_pid, SERVICE_IP)
        listener = pod_net.listen_in(f"/proc/{self.sandbox_pid}/ns/net", SERVICE_IP, SERVICE_PORT)
        self.forwarder = pod_net.Forwarder(listener, self.runner.cfg.api_server, self.name)
        record = pod_net.PeerRecord(self.ns, hostname, spec.get("subdomain"), ip)
        self.runner.peer_up(self.uid, record, self.files.hosts)
        with self.lock:
            self.pod_ip = ip
        self._changed()

    def _teardown(self) -> None:
        if self.forwarder is not None:
            self.forwarder.close()
        if self.sandbox is not None:
            with contextlib.suppress(OSError):
                assert self.sandbox.stdin is not None
                self.sandbox.stdin.close()
            try:
                self.sandbox.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.sandbox.kill()
                self.sandbox.wait()
        self.runner.peer_down(self.uid)
        if self.pod_ip or self.sandbox is not None:
            self.runner.bridge().detach(self.uid, self.pod_ip)
        shutil.rmtree(self.dir, ignore_errors=True)  # volumes' copies of secrets and tokens; logs stay

    # -------------------------------------------------------------- containers

    def _loop(self) -> None:
        while True:
            now = time.monotonic()
            with self.lock:
                grace = self.grace_s
            if grace is not None:
                if self.kill_after is None:
                    self.kill_after = now + grace
                    self._kill_all(force=False)
                if self._all_exited() or now >= self.kill_after:
                    return
            else:
                self._step(now)
                self._refresh_tokens(now)
                if self._terminal():
                    return
            self._changed()
            time.sleep(TICK_S)

    def _terminal(self) -> bool:
        with self.lock:
            return self.init_failed or (
                all(r.done for r in self.containers) and all(r.ever_started for r in self.containers)
            )

    def _step(self, now: float) -> None:
        for r in self.inits:
            if r.state == "terminated" and r.exit_code == 0:
                continue
            self._drive(r, now)
            return  # init containers run one at a time, before any container
        for r in self.containers:
            self._drive(r, now)

    def _drive(self, r: Run, now: float) -> None:
        if r.proc is None:
            if not r.done and now >= r.next_start:
                self._start(r, now)
            return
        code = r.proc.poll()
        if code is None:
            self._probe(r, now)
            if r.kill_at is not None and now >= r.kill_at:
                self._signal(r, signal.SIGKILL)
            return
        self._exited(r, code, now)

    def _start(self, r: Run, now: float) -> None:
        assert self.files is not None
        cdir = self.dir / "containers" / r.name
        (cdir / "root").mkdir(parents=True, exist_ok=True)
        term_log = cdir / "termination-log"
        try:
            facts = pod_env.PodFacts(self.pod_ip, self.runner.cfg.host_ip)
            services = self.runner.lookups.services(self.ns, self.pod["spec"].get("enableServiceLinks", True))
            env = pod_env.container_env(
                self.pod,
                r.spec,
                self.runner.cfg.image,
                services,
                self.runner.lookups,
                facts,
                self.allocatable,
            )
            argv = pod_env.command_line(r.spec, self.runner.cfg.image, env)
            mounts = pod_fs.container_mounts(r.spec, self.volumes, self.files, term_log)
        except (pod_env.EnvError, pod_fs.VolumeError) as err:
            with self.lock:
                if r.message != str(err):
                    self._event(r, "Warning", "Failed", f"Error: {err}")
                r.state, r.reason, r.message = "waiting", "CreateContainerConfigError", str(err)
            r.next_start = now + RETRY_S
            return
        except exceptions.ApiException as err:
            log.warning("pod %s/%s: %s %s", self.ns, self.name, err.status, err.reason)
            r.next_start = now + RETRY_S
            return
        restart = r.ever_started
        count = r.restart_count + (1 if restart else 0)
        log_path = self.log_dir / r.name / f"{count}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        term_log.write_bytes(b"")
        start_error = cdir / "start-error"
        start_error.unlink(missing_ok=True)
        security = r.spec.get("securityContext") or {}
        plan = pod_shim.ContainerPlan(
            sandbox_pid=self.sandbox_pid,
            parent_pid=os.getpid(),
            root_dir=str(cdir / "root"),
            argv=tuple(argv) or ("",),
            env=env,
            cwd=r.spec.get("workingDir") or self.runner.cfg.image.workdir,
            mounts=tuple(mounts),
            exclude=(str(self.runner.cfg.state_dir),),
            no_new_privs=security.get("allowPrivilegeEscalation") is False,
            start_error_file=str(start_error),
        )
        plan_file = pod_shim.dump(plan, cdir / "plan.json")
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.infra.pod_shim", "container", str(plan_file)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)},
                start_new_session=True,
            )
        with self.lock:
            r.proc, r.run_started, r.kill_at = proc, now, None
            r.state, r.reason, r.message = "running", "", ""
            r.started_at, r.finished_at = now_iso(), None
            r.restart_count, r.ever_started = count, True
            r.probes = {
                kind: pod_probe.Prober(r.spec[f"{kind}Probe"], now)
                for kind in ("startup", "readiness", "liveness")
                if r.spec.get(f"{kind}Probe")
            }
            r.ready = not r.init and "readiness" not in r.probes and "startup" not in r.probes
        self._event(r, "Normal", "Started", f"Started container {r.name}")

    def _exited(self, r: Run, code: int, now: float, final: bool = False) -> None:
        """Record a run's end; `final`: the pod is going, nothing restarts."""
        if code < 0:  # the shim itself was killed (SIGKILL after the grace period): 128 + signal
            code = 128 - code
        cdir = self.dir / "containers" / r.name

        def text(p: pathlib.Path) -> str:
            try:
                return p.read_text(errors="replace")
            except OSError:
                return ""

        log_path = self.log_dir / r.name / f"{r.restart_count}.log"
        term = pod_lifecycle.termination(
            code,
            text(cdir / "start-error"),
            text(cdir / "termination-log"),
            str(r.spec.get("terminationMessagePolicy") or "File"),
            text(log_path)[-16384:],
        )
        finished = now_iso()
        policy: pod_lifecycle.RestartPolicy = self.policy
        if r.init and policy == "Always":
            policy = "OnFailure"  # a succeeded init container is never run again
        cfg = self.runner.cfg
        with self.lock:
            ran = now - r.run_started
            r.failures = 1 if ran >= 2 * cfg.backoff_max_s else r.failures + 1
            r.proc, r.ready, r.probes = None, False, {}
            current = (term, r.started_at or finished, finished)
            if not final and pod_lifecycle.restart(policy, code):
                delay = pod_lifecycle.backoff_s(r.failures, cfg.backoff_base_s, cfg.backoff_max_s)
                r.last, r.next_start = current, now + delay
                if delay > 0:
                    r.state, r.reason = "waiting", "CrashLoopBackOff"
                    r.message = (
                        f"back-off {delay:g}s restarting failed container={r.name} "
                        f"pod={self.name}_{self.ns}({self.uid})"
                    )
                else:
                    r.state, r.reason, r.message = "terminated", term.reason, term.message
                    r.exit_code, r.finished_at = code, finished
            else:
                r.done = True
                r.state, r.reason, r.message, r.exit_code = "terminated", term.reason, term.message, code
                r.finished_at = finished
                if r.init and code != 0:
                    self.init_failed = True
        if r.state == "waiting":
            self._event(r, "Warning", "BackOff", "Back-off restarting failed container " + r.name)
        log.info("pod %s/%s: container %s exited %d (%s)", self.ns, self.name, r.name, code, term.reason)

    def _probe(self, r: Run, now: float) -> None:
        startup = r.probes.get("startup")
        started = startup is None or startup.passing
        for kind, prober in list(r.probes.items()):
            if (kind != "startup" and not started) or (kind == "startup" and started) or not prober.due(now):
                continue
            ok = pod_probe.attempt(prober.spec, r.spec, self.pod_ip, self._pid(r))
            prober.record(ok, now)
            if kind in ("liveness", "startup") and prober.failed and r.kill_at is None:
                self._event(r, "Warning", "Unhealthy", f"{kind.capitalize()} probe failed; restarting")
                self._signal(r, signal.SIGTERM)
                r.kill_at = now + float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        readiness = r.probes.get("readiness")
        with self.lock:
            if not r.init:
                r.ready = started and (readiness is None or readiness.passing)

    def _pid(self, r: Run) -> int | None:
        """The container's PID 1 as the host sees it (the shim's only child)."""
        if r.proc is None:
            return None
        try:
            kids = pathlib.Path(f"/proc/{r.proc.pid}/task/{r.proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(kids[0]) if kids else None

    def _signal(self, r: Run, sig: signal.Signals) -> None:
        if r.proc is not None and r.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(r.proc.pid, sig)  # the shim forwards it; SIGKILL of the shim kills PID 1

    def _kill_all(self, force: bool) -> None:
        runs = [*self.inits, *self.containers]
        if not force and any(r.proc is not None for r in runs):
            self._event(None, "Normal", "Killing", "Stopping containers")
        for r in runs:
            self._signal(r, signal.SIGKILL if force else signal.SIGTERM)
        if force:
            for r in runs:
                if r.proc is not None:
                    self._exited(r, r.proc.wait(), time.monotonic(), final=True)

    def _all_exited(self) -> bool:
        done = True
        for r in [*self.inits, *self.containers]:
            if r.proc is not None:
                code = r.proc.poll()
                if code is None:
                    done = False
                else:
                    self._exited(r, code, time.monotonic(), final=True)
        return done

    def _refresh_tokens(self, now: float) -> None:
        for t in self.volumes.tokens:
            if now < self.token_due.get(t.path, 0.0):
                continue
            try:
                token = self.runner.lookups.token(self.pod, t.audience, t.expiration_seconds)
            except exceptions.ApiException as err:
                log.warning("pod %s/%s: token refresh: %s", self.ns, self.name, err.reason)
                self.token_due[t.path] = now + RETRY_S
                continue
            pod_fs.write_file(t.path, token.encode())
            self.token_due[t.path] = now + TOKEN_REFRESH * t.expiration_seconds


class ProcessRunner:
    """node_agent.PodRunner over PodWorkers; also what pod_logs needs to find a container's log."""

    def __init__(self, core: client.CoreV1Api, cfg: RunnerConfig, notify: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.lookups = pod_api.ApiLookups(core)
        self.notify = notify
        self._workers: dict[str, PodWorker] = {}
        self._lock = threading.Lock()
        self._bridge: pod_net.Bridge | None = None
        self._peers: dict[str, tuple[pod_net.PeerRecord, pathlib.Path]] = {}

    def bridge(self) -> pod_net.Bridge:
        with self._lock:
            if self._bridge is None:
                self._bridge = pod_net.Bridge.create()
            return self._bridge

    def sync(self, pod: Pod) -> node_agent.PodState:
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self._workers.get(uid)
            if worker is None:
                worker = self._workers[uid] = PodWorker(self, pod)
                worker.thread.start()
        return worker.snapshot()

    def stop(self, pod: Pod) -> bool:
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self._workers.get(uid)
        if worker is None:
            return True
        meta, spec = pod["metadata"], pod.get("spec", {})
        grace = meta.get("deletionGracePeriodSeconds")
        worker.terminate(float(grace if grace is not None else spec.get("terminationGracePeriodSeconds", 30)))
        if worker.finished.is_set():
            with self._lock:
                self._workers.pop(uid, None)
            return True
        return False

    def power_off(self, pod: Pod) -> None:
        with self._lock:
            worker = self._workers.get(pod["metadata"]["uid"])
        if worker is not None:
            worker.power_off()

    def close(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.terminate(self.cfg.shutdown_grace_s)
        for w in workers:
            w.finished.wait(self.cfg.shutdown_grace_s + 10)
        with self._lock:
            if self._bridge is not None:
                self._bridge.close()
                self._bridge = None

    # -------------------------------------------------------------- peers' names

    def peer_up(self, uid: str, record: pod_net.PeerRecord, hosts: pathlib.Path) -> None:
        with self._lock:
            self._peers[uid] = (record, hosts)
        self._rewrite_hosts(record.namespace)

    def peer_down(self, uid: str) -> None:
        with self._lock:
            gone = self._peers.pop(uid, None)
        if gone is not None:
            self._rewrite_hosts(gone[0].namespace)

    def _rewrite_hosts(self, namespace: str) -> None:
        with self._lock:
            pods = [(r, h) for r, h in self._peers.values() if r.namespace == namespace]
            records = [r for r, _ in pods]
            for record, hosts in pods:
                with contextlib.suppress(OSError):
                    pod_net.write_in_place(hosts, pod_net.hosts_file(record, records))

    # -------------------------------------------------------------- logs

    def log_dir(self, namespace: str, pod: str) -> pathlib.Path | None:
        """The newest log directory of pod `namespace/pod` (its current incarnation if it runs)."""
        with self._lock:
            for w in self._workers.values():
                if (w.ns, w.name) == (namespace, pod):
                    return w.log_dir
        found = sorted(
            (self.cfg.state_dir / "logs").glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime
        )
        return found[-1] if found else None

    def container_running(self, namespace: str, pod: str, container: str) -> bool:
        with self._lock:
            for w in self._workers.values():
                if (w.ns, w.name) == (namespace, pod):
                    return any(r.name == container and r.proc is not None for r in [*w.inits, *w.containers])
        return False
