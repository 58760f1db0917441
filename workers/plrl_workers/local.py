"""`plrl run job.yaml`: the job's pods as processes on this machine, supervised, with live progress.

The same worker code runs as in a cluster: the runner writes the per-role config files the
operator would put in the job's ConfigMap (with loopback endpoints), sets the env a pod would get
(pod index, rank, RPC token), and starts `python -m plrl_workers.trainer` / `.generator` per replica.
Each accelerator of the spec becomes one process on the CPU (or a GPU when there is one).

The run directory holds everything: `job.yaml` (the resolved spec), `model/` (the prepared initial
model), `config/`, `logs/`, `checkpoints/`, `metrics.jsonl`, `summary.json` and `report.png`.
Running again on the same directory resumes from the latest checkpoint.

Neighbours: `supervisor.py` (processes), `local_devices.py` (which GPUs each process sees),
`report.py` (progress, summary, plot), `config.py` (the files it writes), `models/tiny.py` +
`tasks/warm_start.py` (the built-in model).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import pathlib
import secrets
import signal
import socket
import sys
import time
from typing import Any

import yaml

from plrl_operator import spec as spec_mod
from plrl_operator.policy import planner
from plrl_workers import config as config_mod
from plrl_workers import local_devices, report, supervisor

log = logging.getLogger("plrl.run")

PROGRESS_EVERY_S = 5.0


class RunError(RuntimeError):
    """A run that cannot start or continue; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """How many processes of each kind the job becomes on this machine."""

    generator_pods: int
    trainer_pods: int
    gpus_per_trainer: int
    trainer_module: str = "plrl_workers.trainer"

    @property
    def trainer_ranks(self) -> int:
        return self.trainer_pods * self.gpus_per_trainer

    def pods(self, job: spec_mod.JobSpec) -> local_devices.Pods:
        """The pods as `local_devices` hands out GPUs to them."""
        return local_devices.Pods(
            self.trainer_pods, self.gpus_per_trainer, self.generator_pods, job.resources.gpus_per_generator
        )

    @staticmethod
    def of(job: spec_mod.JobSpec) -> Layout:
        r = job.resources
        mode = job.pipeline.mode
        if mode is spec_mod.PipelineMode.CONVENTIONAL:
            # Every accelerator trains and generates: one colocated worker per accelerator.
            return Layout(0, r.total_gpus, 1, "plrl_workers.conventional")
        if mode is not spec_mod.PipelineMode.PIPELINE:
            raise RunError(f"spec.pipeline.mode={mode.value} is not supported by plrl run yet (use pipeline)")
        i = planner.initial_generators(job)
        return Layout(
            generator_pods=i // r.gpus_per_generator,
            trainer_pods=(r.total_gpus - i) // r.gpus_per_trainer,
            gpus_per_trainer=r.gpus_per_trainer,
        )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


# ------------------------------------------------------------------ the run directory


def prepare_run_dir(job: spec_mod.PipelineRLJob, run_dir: pathlib.Path) -> bool:
    """Create or check the run directory; True if it already holds a run of this job (resume)."""
    resolved = yaml.safe_dump(spec_mod.dump_job(job), sort_keys=False)
    job_file = run_dir / "job.yaml"
    if job_file.exists():
        previous = spec_mod.parse_job(yaml.safe_load(job_file.read_text()))
        if previous.spec != job.spec:
            raise RunError(
                f"{run_dir} holds a run of a different job spec; resuming it with this one would mix "
                "two experiments. Use another --run-dir, or delete that directory to start over."
            )
        return True
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file.write_text(resolved)
    return False


def prepare_model(job: spec_mod.PipelineRLJob, run_dir: pathlib.Path, job_dir: pathlib.Path) -> pathlib.Path:
    """The initial model directory every worker loads (built once per run directory)."""
    m = job.spec.model
    if not m.name.startswith("builtin:"):
        path = pathlib.Path(m.name)
        path = path if path.is_absolute() else job_dir / path
        if not (path / "config.json").exists():
            raise RunError(f"spec.model.name: {path} is not a Hugging Face model directory (no config.json)")
        return path
    if m.name != "builtin:tiny":
        raise RunError(f"spec.model.name: unknown builtin model {m.name!r} (known: builtin:tiny)")
    from plrl_workers.models import tiny
    from plrl_workers.tasks import base as tasks
    from plrl_workers.tasks import warm_start

    base_dir = tiny.build(run_dir / "model" / "base", seed=m.seed)
    task = tasks.from_spec(job.spec.task, base_dir=job_dir)
    print(f"preparing the built-in model (warm start: {m.warm_start_steps} supervised steps)...", flush=True)
    return warm_start.run(
        base_dir,
        run_dir / "model" / "init",
        task,
        warm_start.WarmStartConfig(steps=m.warm_start_steps, seed=m.seed),
    )


def check_task(job: spec_mod.PipelineRLJob, job_dir: pathlib.Path) -> None:
    """Fail before any process starts if the task or its reward function cannot be used."""
    from plrl_workers.tasks import base as tasks
    from plrl_workers.tasks import rewards

    try:
        tasks.from_spec(job.spec.task, base_dir=job_dir)
        rewards.load(job.spec.task.reward)
    except (tasks.TaskError, rewards.RewardError) as err:
        raise spec_mod.JobFileError(f"spec.{err}") from None


def worker_config(
    job: spec_mod.PipelineRLJob,
    layout: Layout,
    role: config_mod.Role,
    ports: dict[str, int],
    run_dir: pathlib.Path,
    model_dir: pathlib.Path,
) -> dict[str, Any]:
    """The same document the operator writes to `/etc/plrl/<role>.json`, with loopback endpoints."""
    r = job.spec.resources
    host = "127.0.0.1"
    return {
        "role": role,
        "job": {"name": job.metadata.name, "namespace": None, "uid": None},
        "spec": job.spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"suspend"}),
        "plan": {
            "generatorGPUs": layout.generator_pods * r.gpus_per_generator,
            "trainerGPUs": layout.trainer_ranks,
            "generatorPods": layout.generator_pods,
            "trainerPods": layout.trainer_pods,
        },
        "endpoints": {
            "coordinator": f"{host}:{ports['rpc']}",
            "rendezvous": f"{host}:{ports['rendezvous']}",
            "weightSync": f"{host}:{ports['weightSync']}",
        },
        "ports": {k: ports[k] for k in ("rpc", "rendezvous", "weightSync")} | {"metrics": 0},
        "tokenEnv": "PLRL_TOKEN",
        "local": {"runDir": str(run_dir), "modelDir": str(model_dir)},
    }


def process_specs(
    job: spec_mod.PipelineRLJob, layout: Layout, run_dir: pathlib.Path, model_dir: pathlib.Path
) -> list[supervisor.ProcessSpec]:
    ports = {"rpc": free_port(), "rendezvous": free_port(), "weightSync": free_port()}
    cfg_dir = run_dir / "config"
    cfg_dir.mkdir(exist_ok=True)
    paths = {}
    for role in ("generator", "trainer"):
        doc = worker_config(job, layout, role, ports, run_dir, model_dir)
        config_mod.WorkerConfig.model_validate(doc)  # the workers will read exactly this
        paths[role] = cfg_dir / f"{role}.json"
        paths[role].write_text(json.dumps(doc, indent=2))
    common = {
        "PLRL_TOKEN": secrets.token_urlsafe(24),
        "PLRL_BIND_HOST": "127.0.0.1",
        # Several workers share this machine's cores; one thread each avoids oversubscription
        # (measured: 2 threads per process on 2 shared cores made small ops 20x slower).
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "PYTHONUNBUFFERED": "1",
    }
    trainer_gpus, generator_gpus = local_devices.placements(
        layout.pods(job.spec), local_devices.visible_gpus()
    )
    specs = []
    for rank in range(layout.trainer_ranks):
        env = common | {
            "RANK": str(rank),
            "WORLD_SIZE": str(layout.trainer_ranks),
            "LOCAL_RANK": str(rank % layout.gpus_per_trainer),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(ports["rendezvous"]),
            "PLRL_POD_INDEX": str(rank // layout.gpus_per_trainer),
            "PLRL_METRICS_PORT": str(free_port()),
        }
        env |= trainer_gpus[rank].env
        specs.append(
            supervisor.ProcessSpec(
                name=f"trainer-{rank}",
                role="trainer",
                argv=supervisor.python_module(layout.trainer_module, "--config", str(paths["trainer"])),
                env=env,
                log_path=run_dir / "logs" / f"trainer-{rank}.log",
            )
        )
    for k in range(layout.generator_pods):
        env = common | {"PLRL_POD_INDEX": str(k), "PLRL_METRICS_PORT": str(free_port())}
        env |= generator_gpus[k].env
        specs.append(
            supervisor.ProcessSpec(
                name=f"generator-{k}",
                role="generator",
                argv=supervisor.python_module("plrl_workers.generator", "--config", str(paths["generator"])),
                env=env,
                log_path=run_dir / "logs" / f"generator-{k}.log",
            )
        )
    return specs


# ------------------------------------------------------------------ supervision


def _tail(path: pathlib.Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def supervise(
    sup: supervisor.Supervisor,
    job: spec_mod.PipelineRLJob,
    run_dir: pathlib.Path,
    quiet: bool,
    peak: PeakMemory,
) -> int:
    """Wait for trainer rank 0 to finish; restart dead generators; fail on a dead trainer."""
    total = job.spec.training.total_steps
    max_restarts = job.spec.failure_policy.max_restarts
    restarts = 0
    seen_rows = len(report.read_metrics(run_dir))
    last_print = 0.0
    while True:
        rows = report.read_metrics(run_dir)
        if (
            not quiet
            and rows
            and (len(rows) > seen_rows)
            and time.monotonic() - last_print >= PROGRESS_EVERY_S
        ):
            print(report.progress_line(rows[-1], total), flush=True)
            last_print = time.monotonic()
            seen_rows = len(rows)
        for name, code in sup.exited().items():
            spec = sup.running[name].spec
            if name == "trainer-0" and code == 0:
                return 0
            if code == 0:
                # Other ranks, and generators told to stop, finish first; rank 0 (the coordinator)
                # says when the job is done.
                continue
            if spec.role == "trainer":
                raise RunError(
                    f"{name} exited with code {code}; last lines of {spec.log_path}:\n{_tail(spec.log_path)}"
                )
            if restarts >= max_restarts:
                raise RunError(
                    f"{name} exited with code {code} and spec.failurePolicy.maxRestarts={max_restarts} "
                    f"restarts are used up; last lines of {spec.log_path}:\n{_tail(spec.log_path)}"
                )
            restarts += 1
            print(f"{name} exited with code {code}; restarting it ({restarts}/{max_restarts})", flush=True)
            sup.restart(name)
        peak.sample(sup)
        time.sleep(0.5)


class PeakMemory:
    """Largest total resident memory of the run's processes (children of children included)."""

    def __init__(self) -> None:
        self.peak_bytes = 0

    def sample(self, sup: supervisor.Supervisor) -> None:
        import psutil

        total = 0
        for r in sup.running.values():
            try:
                root = psutil.Process(r.proc.pid)
                total += sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                continue  # exited between listing and reading
        self.peak_bytes = max(self.peak_bytes, total)


def run(job_path: pathlib.Path, run_dir: pathlib.Path, quiet: bool = False) -> int:
    job = spec_mod.load_job(job_path)  # raises before anything starts
    check_task(job, job_path.parent.resolve())
    layout = Layout.of(job.spec)
    resumed = prepare_run_dir(job, run_dir)
    model_dir = prepare_model(job, run_dir, job_path.parent.resolve())
    specs = process_specs(job, layout, run_dir, model_dir)
    print(
        f"{'resuming' if resumed else 'starting'} {job.metadata.name} ({job.spec.pipeline.mode.value}): "
        f"{layout.trainer_ranks} trainer rank(s), {layout.generator_pods} generator(s), "
        f"{job.spec.training.total_steps} steps; "
        f"run directory {run_dir}",
        flush=True,
    )
    sup = supervisor.Supervisor()
    peak = PeakMemory()
    interrupted = False

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for spec in specs:
            sup.start(spec)
        code = supervise(sup, job, run_dir, quiet, peak)
    except KeyboardInterrupt:
        interrupted = True
        code = 130
    finally:
        sup.stop()
    rows = report.read_metrics(run_dir)
    summary = report.summarize(rows) | {"peak_rss_mb": round(peak.peak_bytes / 2**20)}
    report.write_summary(run_dir, summary)
    if rows:
        report.plot(rows, run_dir / report.REPORT_FILE, title=job.metadata.name)
    print(report.summary_text(summary))
    if interrupted:
        print(f"interrupted; `plrl run {job_path} --run-dir {run_dir}` resumes from the last checkpoint")
    else:
        print(f"report: {run_dir / report.REPORT_FILE}")
    return code


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="plrl run", description="Run a PipelineRLJob on this machine.")
    ap.add_argument("job", type=pathlib.Path, help="the job YAML (kind PipelineRLJob)")
    ap.add_argument("--run-dir", type=pathlib.Path, help="where to write the run (default: runs/<job name>)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines, only the summary")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        job_name = spec_mod.load_job(args.job).metadata.name
        run_dir = (args.run_dir or pathlib.Path("runs") / job_name).resolve()
        return run(args.job, run_dir, args.quiet)
    except (spec_mod.JobFileError, RunError) as err:
        print(f"plrl run: {err}", file=sys.stderr)
        return 2 if isinstance(err, spec_mod.JobFileError) else 1
