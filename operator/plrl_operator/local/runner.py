"""`plrl run job.yaml`: the job's pods as processes on this machine, with the operator's decisions.

The runner is a second controller next to the operator: it writes the same `WorkerConfig` files the
operator puts in the job's ConfigMap (`plrl_api.worker_config.build`, with loopback endpoints and
run-directory paths), sets the environment a pod would get (`plrl_api.identity`), starts
`plrl-worker --role <role>` per replica (each accelerator of the spec is one process, on the CPU
or a GPU), and then loops observe -> `policy.decide` -> act: a failed generator is restarted, a
failed trainer restarts every trainer from the latest checkpoint (the generators reconnect), a failure with
`failurePolicy.maxRestarts` used up ends the run `Failed`, trainer rank 0 finishing ends it.

The run directory holds everything: `job.yaml` (the resolved spec), `model/` (the prepared initial
model), `config/`, `logs/`, `checkpoints/`, `metrics.jsonl`, `summary.json` and `report.png`.
Running again on the same directory resumes from the latest checkpoint.

Neighbours: `local.processes` (the processes), `local.devices` (which GPUs each sees),
`local.report` (progress, summary, plot),
`policy.decide` (what to do), `plrl_workers.prepare` (the init step: task check, built-in model).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from plrl_api import identity, names, plan, records, worker_config
from plrl_api import spec as spec_mod
from plrl_operator import certs, jobfile
from plrl_operator.local import autoscaling, chaos, chaos_report, devices, processes, report
from plrl_operator.policy import decide, health

log = logging.getLogger("plrl.run")

PROGRESS_EVERY_S = 5.0
LOOK_EVERY_S = 0.5  # how often the processes, heartbeats and records are looked at
LOOPBACK = "127.0.0.1"
CHAOS_FILE = "chaos.json"  # with --chaos: the faults injected and the restarts they caused
LOG_TAIL_LINES = 15


class RunError(RuntimeError):
    """A run that cannot start or continue; the message says why and what to do."""


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


# ------------------------------------------------------------------ the run directory


def prepare_run_dir(job: spec_mod.PipelineRLJob, run_dir: pathlib.Path) -> bool:
    """Create or check the run directory; True if it already holds a run of this job (resume)."""
    job_file = run_dir / "job.yaml"
    if job_file.exists():
        previous = jobfile.load_job(job_file)
        if previous.spec != job.spec:
            raise RunError(
                f"{run_dir} holds a run of a different job spec; resuming it with this one would mix "
                "two experiments. Use another --run-dir, or delete that directory to start over."
            )
        return True
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file.write_text(jobfile.dump_yaml(spec_mod.dump_job(job)))
    return False


def local_paths(
    job: spec_mod.PipelineRLJob, run_dir: pathlib.Path, job_dir: pathlib.Path
) -> worker_config.Paths:
    """Where this run's workers find their files: the run directory, and the job file's neighbours."""
    m, ds = job.spec.model, job.spec.task.dataset
    model = pathlib.Path(m.name) if not m.name.startswith("builtin:") else run_dir / "model" / "init"
    dataset: str | None = None
    if ds is not None:
        if ds.path is None:
            raise spec_mod.JobFileError(
                "spec.task.dataset.configMap: plrl run reads prompts from a file; set dataset.path"
            )
        dataset = str(ds.path if pathlib.Path(ds.path).is_absolute() else job_dir / ds.path)
    return worker_config.Paths(
        model_dir=str(model if model.is_absolute() else job_dir / model),
        checkpoint_dir=str(run_dir / "checkpoints"),
        dataset_file=dataset,
        run_dir=str(run_dir),
    )


def loopback_endpoints(shared_gpus: bool = False) -> worker_config.Endpoints:
    """Fresh loopback ports for a run: kept for its lifetime, so generators find a restarted
    trainer rank 0 where they found the one before (as a pod's Service name stays)."""
    return worker_config.Endpoints(
        coordinator=f"{LOOPBACK}:{free_port()}",
        rendezvous=f"{LOOPBACK}:{free_port()}",
        weight_sync=f"{LOOPBACK}:{free_port()}",
        metrics_port=0,  # each process gets its own (ENV_METRICS_PORT)
        collective_backend="gloo" if shared_gpus else None,  # NCCL refuses two ranks on one GPU
    )


def write_configs(
    job: spec_mod.PipelineRLJob,
    pod_plan: plan.PodPlan,
    paths: worker_config.Paths,
    cfg_dir: pathlib.Path,
    endpoints: worker_config.Endpoints,
) -> dict[names.Role, pathlib.Path]:
    """The per-role config files."""
    cfg_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for role in names.ROLES:
        out[role] = cfg_dir / f"{role}.json"
        out[role].write_text(worker_config.dump(worker_config.build(job, pod_plan, role, endpoints, paths)))
    return out


def token_path(run_dir: pathlib.Path) -> pathlib.Path:
    """Where a run keeps its job token (the cluster's Secret): `<run_dir>/secret/token`, 0600."""
    return run_dir / "secret" / names.TOKEN_KEY


def run_secret(run_dir: pathlib.Path) -> str:
    """The run's token and TLS files in `<run_dir>/secret/` (what a job's Secret holds); kept when
    the run is resumed (its checkpoints are signed with the token). Returns the token."""
    path = token_path(run_dir)
    try:
        token = identity.read_token(str(path))
    except identity.IdentityError:
        token = secrets.token_urlsafe(24)
        identity.write_token(path, token)
    if not (path.parent / names.CHECKPOINT_KEY_KEY).exists():
        identity.write_token(path.parent / names.CHECKPOINT_KEY_KEY, secrets.token_urlsafe(32))
    if not (path.parent / names.TLS_CA_KEY).exists():
        certs.write_files(path.parent, certs.job_tls())
    return token


def process_specs(
    pod_plan: plan.PodPlan,
    configs: dict[names.Role, pathlib.Path],
    token_file: pathlib.Path,
    run_dir: pathlib.Path,
    gpus: devices.Placements,
) -> list[processes.ProcessSpec]:
    """One process per accelerator: trainer ranks first (rank 0 is the coordinator), then generators,
    each seeing the GPUs `gpus` gives it."""
    common = {
        names.ENV_TOKEN_FILE: str(token_file),
        names.ENV_BIND_HOST: LOOPBACK,
        # Several workers share this machine's cores; one thread each avoids oversubscription
        # (measured: 2 threads per process on 2 shared cores made small ops 20x slower).
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "PYTHONUNBUFFERED": "1",
    }

    def spec(
        role: names.Role, name: str, pod: int, local_rank: int | None, placed: Mapping[str, str]
    ) -> processes.ProcessSpec:
        env = (
            common | {names.ENV_POD_INDEX: str(pod), names.ENV_METRICS_PORT: str(free_port())} | dict(placed)
        )
        if local_rank is not None:
            env[names.ENV_LOCAL_RANK] = str(local_rank)
        return processes.ProcessSpec(
            name=name,
            role=role,
            argv=processes.python_module("plrl_workers", "--role", role, "--config", str(configs[role])),
            env=env,
            log_path=run_dir / "logs" / f"{name}.log",
        )

    gpt = pod_plan.gpus_per_trainer
    out = [
        spec(
            names.TRAINER,
            names.local_process(names.TRAINER, rank),
            rank // gpt,
            rank % gpt,
            gpus.trainers[rank],
        )
        for rank in range(pod_plan.trainer_gpus)
    ]
    out += [
        spec(names.GENERATOR, names.local_process(names.GENERATOR, k), k, None, gpus.generators[k])
        for k in range(pod_plan.generator_pods)
    ]
    return out


def prepare(job: spec_mod.PipelineRLJob, trainer_config: pathlib.Path, run_dir: pathlib.Path) -> None:
    """The init step (`plrl_workers.prepare`): check the task, build the built-in model.

    Its output (library warnings, progress bars) goes to `logs/prepare.log`; the terminal gets one
    line saying what is happening, and the reason if it fails.
    """
    m = job.spec.model
    if m.name.startswith("builtin:"):
        print(
            f"preparing the built-in model ({m.warm_start_steps} warm-start steps; reused when the "
            "run directory or the machine's cache of prepared models has it)...",
            flush=True,
        )
    log_path = run_dir / "logs" / "prepare.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = processes.python_module("plrl_workers.prepare", "--config", str(trainer_config))
    with log_path.open("w") as log_file:
        proc = subprocess.run(argv, stdout=log_file, stderr=subprocess.PIPE, text=True, check=False)
    with log_path.open("a") as log_file:
        log_file.write(proc.stderr)
    if proc.returncode == 2:
        raise spec_mod.JobFileError(
            proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "invalid job"
        )
    if proc.returncode != 0:
        raise RunError(f"preparing the run failed (exit {proc.returncode}); last lines:\n{_tail(log_path)}")


def _tail(path: pathlib.Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ------------------------------------------------------------------ observe -> decide -> act


@dataclasses.dataclass
class Launch:
    """What starting (or restarting) the job's processes needs."""

    job: spec_mod.PipelineRLJob
    pod_plan: plan.PodPlan
    paths: worker_config.Paths
    run_dir: pathlib.Path
    token: str

    gpus: devices.Placements
    endpoints: worker_config.Endpoints

    def configs(self) -> dict[names.Role, pathlib.Path]:
        cfg_dir = self.run_dir / "config"
        return write_configs(self.job, self.pod_plan, self.paths, cfg_dir, self.endpoints)

    def specs(self) -> list[processes.ProcessSpec]:
        return process_specs(self.pod_plan, self.configs(), token_path(self.run_dir), self.run_dir, self.gpus)


@dataclasses.dataclass(frozen=True)
class LocalLease:
    """A process's heartbeat file as last written."""

    renewed: datetime.datetime
    report: records.WorkerReport | None
    released: bool
    """It stopped renewing on purpose (exiting): its silence says nothing."""


def _lease(run_dir: pathlib.Path, name: str) -> LocalLease | None:
    """When process `name` last renewed its heartbeat file, and what it reported then."""
    try:
        lease = json.loads((run_dir / records.HEARTBEAT_DIR / f"{name}.json").read_text())
        renewed = datetime.datetime.fromisoformat(str(lease["spec"]["renewTime"]))
        annotations = lease["metadata"].get("annotations") or {}
        released = annotations.get(names.ANNOTATION_RELEASED) == "true"
        return LocalLease(renewed, records.parse_annotations(annotations), released)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # none yet, or being replaced this instant: the next look sees it


def _beat(run_dir: pathlib.Path, name: str, r: processes.Running) -> tuple[health.Beat, LocalLease | None]:
    """Process `name`'s heartbeat as `health` judges it, and the lease file it was read from."""
    lease = _lease(run_dir, name)
    return health.Beat(name, True, r.started_utc, lease.renewed if lease is not None else None), lease


def observe(
    sup: processes.Supervisor,
    run_dir: pathlib.Path,
    job: spec_mod.PipelineRLJob,
    now: datetime.datetime | None = None,
) -> decide.Observation:
    """The processes as `policy.decide` sees them. Trainer rank 0 exits 0 only once the last step
    is trained and checkpointed (or when told to stop, which only this runner does). A running
    process whose heartbeat file has not been renewed for `heartbeat.timeoutSeconds` is hung
    (stopped, deadlocked) and needs a restart like a dead one; so does a generator that trainer rank
    0 reports slow for `failurePolicy.slowGeneratorReplaceSeconds` (`health.stays_slow`)."""
    now = now or datetime.datetime.now(datetime.UTC)
    heartbeat, child = job.spec.heartbeat, names.Names(job.metadata.name)
    coordinator = _lease(run_dir, names.local_process(names.TRAINER, 0))
    report = coordinator.report if coordinator is not None else None
    progress = report.progress if report is not None else None
    slow = {s.generator: s for s in progress.slow_generators} if progress is not None else {}
    workers = []
    exited = sup.exited()
    for name, r in sorted(sup.running.items()):
        code = exited.get(name)
        failed = code is not None and code != 0
        detail = f"last lines of {r.spec.log_path}:\n{_tail(r.spec.log_path)}" if failed else ""
        how = ""
        if code is None:
            beat, lease = _beat(run_dir, name, r)
            started = r.started_utc
            gen_id = child.pod(names.GENERATOR, int(r.spec.env.get(names.ENV_POD_INDEX, "0")))
            exiting = lease is not None and lease.released and lease.renewed >= started
            silent = None if exiting else health.verdict(beat, now, heartbeat, digits=1)
            if silent is not None:
                failed = True
                detail = silent
            elif r.spec.role == names.GENERATOR and gen_id in slow and coordinator is not None:
                why = health.stays_slow(slow[gen_id], coordinator.renewed, started, job.spec.failure_policy)
                if why is not None:
                    failed, how, detail = True, "stayed slow", why
        workers.append(
            decide.Worker(
                name=name,
                role=r.spec.role,
                instance=r.instance,
                running=code is None,
                exit_code=code,
                needs_restart=failed,
                detail=detail,
                how=how,
            )
        )
    return decide.Observation(workers=tuple(workers), finished=exited.get("trainer-0") == 0)


class Controller:
    """`plrl run`'s loop over one job's processes (and, with `--chaos`, the faults put into them)."""

    def __init__(
        self,
        launch: Launch,
        sup: processes.Supervisor,
        quiet: bool,
        faults: chaos.Schedule | None = None,
    ) -> None:
        self.launch, self.sup, self.quiet = launch, sup, quiet
        self.faults = faults
        self.history = decide.History()
        self.peak = PeakMemory()
        self._shown_rows = len(report.read_records(launch.run_dir))
        self._last_print = 0.0
        self._t0 = 0.0  # when the processes first started: the clock of chaos.json
        self._step: int | None = None  # the latest trained step seen
        self.restarts: list[dict[str, object]] = []
        """Each restart: seconds since the processes started, the worker, the policy's reason."""
        self.progress: list[tuple[float, int | None]] = []
        """(seconds since the processes started, latest step) at every change the runner saw."""
        spec = launch.job.spec
        scaled = spec.pipeline.autoscale.enabled and spec.pipeline.mode is spec_mod.PipelineMode.PIPELINE
        self.autoscaler = autoscaling.LocalAutoscaler.for_job(spec) if scaled else None

    def _pid(self, name: str) -> int | None:
        r = self.sup.running.get(name)
        return r.proc.pid if r is not None and r.proc.poll() is None else None

    def _starting(self, name: str) -> bool:
        """Whether process `name` has not renewed its heartbeat since it (re)started."""
        r = self.sup.running.get(name)
        if r is None:
            return False
        return not health.has_beaten(_beat(self.launch.run_dir, name, r)[0])

    def _inject(self, actions: Sequence[chaos.Action]) -> None:
        for action in actions:
            chaos.apply(action, self._pid)

    def end_faults(self) -> None:
        """SIGCONT whatever the chaos stopped, so the final SIGTERM reaches it."""
        if self.faults is not None:
            self._inject(self.faults.end())

    def start(self) -> None:
        for spec in self.launch.specs():
            self.sup.start(spec)

    def run(self) -> int:
        """Until the job finishes (0) or fails (RunError)."""
        self.start()
        self._t0 = time.monotonic()
        if not self.quiet:
            print(report.PROGRESS_LEGEND, flush=True)
        spec = self.launch.job.spec
        next_look = 0.0
        while True:
            if time.monotonic() >= next_look:
                rows = self._progress()
                observed = observe(self.sup, self.launch.run_dir, self.launch.job)
                verdict = decide.decide(spec, observed, self.history)
                self.history = verdict.history
                group = decide.trainer_group(verdict.decisions, observed.workers)
                for d in verdict.decisions:
                    if isinstance(d, decide.Finish):
                        return 0
                    if isinstance(d, decide.Fail):
                        raise RunError(d.reason)
                    if d.role == names.GENERATOR:
                        self._restart(d, [d.worker])
                    elif group:  # the first trainer decision restarts the whole group
                        self._restart(d, list(group))
                        group = ()
                self.peak.sample(self.sup)
                step = rows[-1].step if rows else None
                if step != self._step:
                    self.progress.append((round(time.monotonic() - self._t0, 3), step))
                self._step = step
                if self.autoscaler is not None and not verdict.decisions:
                    # A fault due at this step must hit the process it was meant for, not its successor.
                    if self.faults is not None:
                        self._inject(self.faults.due(step, time.monotonic() - self._t0, self._starting))
                    self._autoscale(rows)
                next_look = time.monotonic() + LOOK_EVERY_S
            time.sleep(self._tick())

    def _tick(self) -> float:
        """Inject the faults due now; how long to sleep until the next look or timed fault."""
        until_look = LOOK_EVERY_S
        if self.faults is None:
            return until_look
        elapsed = time.monotonic() - self._t0
        self._inject(self.faults.due(self._step, elapsed, self._starting))
        at = self.faults.next_at(elapsed)
        return until_look if at is None else min(until_look, max(0.005, at - elapsed))

    def _restart(self, d: decide.Restart, targets: list[str]) -> None:
        """Restart `targets`: the failed generator, or every trainer (`decide.trainer_group`)."""
        elapsed = round(time.monotonic() - self._t0, 3)
        self.restarts.append({"elapsed_s": elapsed, "worker": d.worker, "reason": d.reason})
        if self.faults is not None:  # a restarted process starts free of its predecessor's faults
            for name in targets:
                self._inject(self.faults.forget(name))
        if d.role == names.GENERATOR:
            print(f"{d.reason}; restarting it", flush=True)
            self.sup.restart(d.worker)
            return
        # The trainers resume from the latest checkpoint, which holds the coordinator's prompt
        # state. Generators keep their processes and models and reconnect to the new rank 0 at the
        # same address.
        print(f"{d.reason}; restarting the trainers from the latest checkpoint", flush=True)
        trainers = {n: self.sup.running[n].restarts + 1 for n in targets}
        self.sup.stop(list(trainers))
        for spec in self.launch.specs():
            if spec.name in trainers:
                self.sup.start(spec, restarts=trainers[spec.name])

    def _autoscale(self, rows: list[records.StepRecord]) -> None:
        assert self.autoscaler is not None
        plan_now = self.launch.pod_plan
        gens = [names.local_process(names.GENERATOR, k) for k in range(plan_now.generator_pods)]
        leases = [_lease(self.launch.run_dir, n) for n in gens]
        caps = [x.report.capacity_tokens_per_second if x and x.report else None for x in leases]
        d = self.autoscaler.look_at(rows, plan_now.generator_gpus, caps, time.monotonic() - self._t0)
        if d is not None:
            began = time.monotonic() - self._t0
            self._resize(d.generators, d.reason)
            # The old trainers may finish the step they were on while stopping: the change is paid
            # for once the new ones pass whatever the old ones reached.
            last = report.read_records(self.launch.run_dir)
            self.autoscaler.applied(began, max((r.step for r in last[-1:]), default=0))
            self.autoscaler.write(self.launch.run_dir)

    def _resize(self, generator_gpus: int, reason: str) -> None:
        """Change I: generators leave (SIGTERM) or join, and the trainers restart with the new world
        size from the checkpoint they write when stopped (SIGTERM: the group ends its step and saves
        it, so no step is trained twice); the restored coordinator re-queues every lease the
        checkpoint holds, so a leaving generator's unfinished prompts are not lost. Generators that
        stay keep running and reconnect to the new trainer rank 0."""
        old = self.launch.pod_plan
        new = plan.PodPlan.of(self.launch.job.spec, generator_gpus)
        print(f"{reason}; {old.trainer_gpus} -> {new.trainer_gpus} trainer rank(s)", flush=True)
        trainers = process_names(old, names.TRAINER)
        kept = process_names(new, names.GENERATOR)
        leaving = [n for n in process_names(old, names.GENERATOR) if n not in kept]
        if self.faults is not None:  # as after a failover restart: new processes start free of faults
            for name in [*leaving, *trainers]:
                self._inject(self.faults.forget(name))
        restarts = {n: self.sup.running[n].restarts + 1 for n in trainers}
        # Together: the trainers resume from their checkpoint, which re-queues whatever the leaving
        # generators still hold, so there is nothing to gain from draining them first.
        self.sup.remove([*leaving, *trainers])
        self.launch.pod_plan = new
        self.launch.gpus = devices.placements(new, devices.visible_gpus())
        staying = set(kept) & set(process_names(old, names.GENERATOR))
        for spec in self.launch.specs():
            if spec.role == names.TRAINER:
                self.sup.start(spec, restarts=restarts.get(spec.name, 0))
            elif spec.name not in staying:
                self.sup.start(spec)

    def _progress(self) -> list[records.StepRecord]:
        """The run's records so far; prints a progress line every `PROGRESS_EVERY_S`."""
        rows = report.read_records(self.launch.run_dir)
        if self.quiet or time.monotonic() - self._last_print < PROGRESS_EVERY_S:
            return rows
        if rows and len(rows) > self._shown_rows:
            print(report.progress_line(rows[-1], self.launch.job.spec.training.total_steps), flush=True)
            self._last_print = time.monotonic()
            self._shown_rows = len(rows)
        return rows


class PeakMemory:
    """Largest total resident memory of the run's processes (children of children included)."""

    def __init__(self) -> None:
        self.peak_bytes = 0

    def sample(self, sup: processes.Supervisor) -> None:
        import psutil

        total = 0
        for r in sup.running.values():
            try:
                root = psutil.Process(r.proc.pid)
                total += sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                continue  # exited between listing and reading
        self.peak_bytes = max(self.peak_bytes, total)


def process_names(pod_plan: plan.PodPlan, role: names.Role | None = None) -> list[str]:
    """The names `process_specs` gives the job's processes (of one `role`, if given)."""
    trainers = [names.local_process(names.TRAINER, r) for r in range(pod_plan.trainer_gpus)]
    generators = [names.local_process(names.GENERATOR, k) for k in range(pod_plan.generator_pods)]
    if role is None:
        return trainers + generators
    return trainers if role == names.TRAINER else generators


def run(
    job_path: pathlib.Path,
    run_dir: pathlib.Path,
    quiet: bool = False,
    overrides: Sequence[str] = (),
    chaos_plan: chaos.ChaosPlan | None = None,
) -> int:
    job = jobfile.load_job(job_path, overrides)  # raises before anything starts
    job_dir = job_path.parent.resolve()
    pod_plan = plan.PodPlan.of(job.spec, decide.current_generators(job.spec, None))
    faults = (
        None
        if chaos_plan is None
        else chaos.Schedule(chaos.resolve(chaos_plan, process_names(pod_plan), job.spec.training.total_steps))
    )
    paths = local_paths(job, run_dir, job_dir)
    if job.spec.pipeline.mode is spec_mod.PipelineMode.HYBRID:
        raise RunError("spec.pipeline.mode=hybrid is not supported by plrl run yet (use pipeline)")
    resumed = prepare_run_dir(job, run_dir)
    gpus = devices.placements(pod_plan, devices.visible_gpus())
    launch = Launch(
        job,
        pod_plan,
        paths,
        run_dir,
        token=run_secret(run_dir),
        gpus=gpus,
        endpoints=loopback_endpoints(gpus.shared),
    )
    try:
        prepare(job, launch.configs()[names.TRAINER], run_dir)
    except spec_mod.JobFileError:
        if not resumed:  # refused before any worker started: leave nothing behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    print(
        f"{'resuming' if resumed else 'starting'} {job.metadata.name} ({job.spec.pipeline.mode.value}): "
        f"{pod_plan.trainer_gpus} trainer rank(s), {pod_plan.generator_pods} generator(s), "
        f"{job.spec.training.total_steps} steps; "
        f"run directory {run_dir}",
        flush=True,
    )
    sup = processes.Supervisor()
    controller = Controller(launch, sup, quiet, faults)
    outcome: report.Outcome = "finished"

    def on_signal(signum: int, _frame: object) -> None:
        # Once: the first Ctrl-C/SIGTERM unwinds to the stop below; later ones must not interrupt
        # the stop itself (it ends with SIGKILL for whatever is left, so it is bounded anyway).
        signal.signal(signal.SIGINT, on_repeat)
        signal.signal(signal.SIGTERM, on_repeat)
        raise KeyboardInterrupt

    def on_repeat(signum: int, _frame: object) -> None:
        print("already stopping: workers still running get SIGKILL within 15 s", file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    failure: RunError | None = None
    try:
        code = controller.run()
    except KeyboardInterrupt:
        outcome, code = "interrupted", 130
    except RunError as err:
        outcome, code, failure = "failed", 1, err
    finally:
        controller.end_faults()
        sup.stop()
    if faults is not None:
        injected = [i.model_dump(mode="json") for i in faults.injected]
        doc = {"injected": injected, "restarts": controller.restarts, "progress": controller.progress}
        (run_dir / CHAOS_FILE).write_text(json.dumps(doc, indent=1))
        print(
            f"chaos: {len(injected)} fault(s) injected, {controller.history.restarts} restart(s) charged; "
            f"see {run_dir / CHAOS_FILE}"
        )
        for kind in chaos_report.by_kind(chaos_report.fault_costs(doc)):
            print(f"chaos: {kind.line()}")
    if controller.autoscaler is not None:
        controller.autoscaler.write(run_dir)
        print(f"{controller.autoscaler.summary()}; see {run_dir / autoscaling.DECISIONS_FILE}")
        if (cost := controller.autoscaler.cost_s) is not None:
            print(
                f"autoscaler: the last change of I cost {cost:.1f} s (from the decision "
                "until training passed the step it had reached)"
            )
    rows = report.read_records(run_dir)
    summary = report.summarize(
        rows,
        peak_rss_mb=round(controller.peak.peak_bytes / 2**20),
        outcome=outcome,
        total_steps=job.spec.training.total_steps,
    )
    report.write_summary(run_dir, summary)
    # The summary first: drawing the report takes ~2 s (matplotlib), which a user who pressed
    # Ctrl-C should not wait for to see what was trained.
    print(report.summary_text(summary), flush=True)
    if outcome == "interrupted":
        print(f"interrupted; `plrl run {job_path} --run-dir {run_dir}` resumes from the last checkpoint")
    if rows:
        report.plot(rows, run_dir / report.REPORT_FILE, title=job.metadata.name, reward=job.spec.task.reward)
        print(f"report: {run_dir / report.REPORT_FILE}")
    if failure is not None:
        raise failure  # `main` prints why, after the summary of what was trained
    return code


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="plrl run", description="Run a PipelineRLJob on this machine.")
    ap.add_argument("job", type=pathlib.Path, help="the job YAML (kind PipelineRLJob)")
    ap.add_argument("--run-dir", type=pathlib.Path, help="where to write the run (default: runs/<job name>)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines, only the summary")
    ap.add_argument(
        "--steps", type=int, metavar="N", help="train N optimizer steps (sets spec.training.totalSteps)"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field of the job file, validated like the file: e.g. "
        "--set spec.training.batchSize=64 (repeatable; a resumed run must be given the same overrides)",
    )
    ap.add_argument(
        "--chaos",
        metavar="SPEC",
        help="inject faults to watch the job recover, e.g. kill:generator-0@step=20,"
        "stop:trainer-1@step=40:30s,slow:generator-1@step=10:4x, or random:N[:seed=S] "
        "(see plrl_operator/local/chaos.py)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    overrides = [*args.set, *([f"spec.training.totalSteps={args.steps}"] if args.steps is not None else [])]
    try:
        chaos_plan = chaos.parse(args.chaos) if args.chaos is not None else None
        job_name = jobfile.load_job(args.job, overrides).metadata.name
        run_dir = (args.run_dir or pathlib.Path("runs") / job_name).resolve()
        return run(args.job, run_dir, args.quiet, overrides, chaos_plan)
    except (spec_mod.JobFileError, chaos.ChaosError, RunError) as err:
        print(f"plrl run: {err}", file=sys.stderr)
        return 1 if isinstance(err, RunError) else 2
