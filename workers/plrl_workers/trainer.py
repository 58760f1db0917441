"""The trainer role: data-parallel RL steps on rollouts as they arrive; rank 0 also coordinates.

One process per trainer rank (`plrl-worker --role trainer --config /etc/plrl/trainer.json`; a pod
with several accelerators starts one rank per accelerator, like torchrun). Rank 0 runs the
job's coordinator: the gRPC service generators lease prompts from and stream rollouts to, the
weight broadcaster, and the run's metrics log. Every optimizer step:

1. rank 0 takes B/G rollout groups from the coordinator (blocking: backpressure on generators),
2. all ranks get the same groups and `rl.step.prepare` applies the lag policy, computes
   leave-one-out advantages and packs this rank's share into micro-batches,
3. `rl.step.train_step` runs them through the training engine and one optimizer step,
4. rank 0 tells the coordinator which prompts were trained or dropped, broadcasts the new weights
   to the generators in flight (every `pipeline.weightSyncEverySteps`), writes a metrics line, and
5. every `training.checkpoint.everySteps`, and when asked to stop (SIGTERM: a resize, a suspend), all
   ranks write a checkpoint that includes the coordinator's prompt accounting, so a restarted job
   neither loses nor repeats a prompt, and one stopped on purpose redoes no step.

Neighbours: `coordinator/`, `rpc/server.py`, `weight_sync/sender.py`, `rl/step.py`,
`engines/training.py`, `checkpoint.py`, `tasks/` (the prompt source), `plrl_api.records` (the
step records it writes),
`heartbeat.py` (in a cluster: each pod's Lease; rank 0's carries the job's progress),
`lifecycle.py` (in a pod, a finished trainer waits for SIGTERM instead of exiting).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import numpy
import torch
import torch.distributed as dist

from plrl_api import identity, names, records, worker_config
from plrl_api import spec as spec_mod
from plrl_workers import checkpoint, checkpoint_manifest, heartbeat, lifecycle, metrics, protocol
from plrl_workers.coordinator import core as coordinator
from plrl_workers.engines import base as engines
from plrl_workers.engines import factory, training
from plrl_workers.rl import step as rl_step
from plrl_workers.rpc import convert as rpc_convert
from plrl_workers.rpc import limits as rpc_limits
from plrl_workers.rpc import server as rpc_server
from plrl_workers.tasks import base as tasks
from plrl_workers.tasks import registry
from plrl_workers.weight_sync import sender, snapshot

log = logging.getLogger("plrl.trainer")

TAKE_TIMEOUT_S = 5.0
SLOW_WINDOW_MIN_S = 15.0  # shortest window over which generators' completion rates are compared


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """This process's place in the trainer group (from `Identity` and the pod plan)."""

    rank: int
    world_size: int
    local_rank: int

    @staticmethod
    def of(cfg: worker_config.WorkerConfig, ident: identity.Identity) -> RankInfo:
        return RankInfo(
            rank=ident.rank(cfg.pods().gpus_per_trainer),
            world_size=cfg.pods().trainer_gpus,
            local_rank=ident.local_rank or 0,
        )


@dataclasses.dataclass(frozen=True)
class BatchStats:
    """Reward, lag and version mixing of one optimizer batch (the StepRecord fields it fills)."""

    reward_mean: float | None
    lag_mean: float
    lag_max: int
    mixed_version_samples: int
    completion_tokens: int

    @staticmethod
    def of(groups: list[protocol.RolloutGroup], version: int) -> BatchStats:
        samples = [s for g in groups for s in g.samples]
        versions = numpy.concatenate([numpy.zeros(0, numpy.int32)] + [s.versions for s in samples])
        return BatchStats(
            reward_mean=sum(s.reward for s in samples) / len(samples) if samples else None,
            lag_mean=float(version - versions.mean()) if len(versions) else 0.0,
            lag_max=int(version - versions.min()) if len(versions) else 0,
            mixed_version_samples=sum(1 for s in samples if len(numpy.unique(s.versions)) > 1),
            completion_tokens=sum(len(s.token_ids) for s in samples),
        )


# Train-step metrics that have a field of their own in `records.StepRecord`; the rest go to `details`.
_TYPED_METRICS = frozenset({"loss", "ess", "input_tokens", "version"})


def _trainable_vocab(tokenizer_size: int, model_dir: str) -> int:
    """Token ids a rollout may hold: those the tokenizer and the model's embedding both have (an id
    past the embedding would end the job in the trainer's forward pass)."""
    import transformers

    model_size = getattr(transformers.AutoConfig.from_pretrained(model_dir), "vocab_size", None)
    return min(tokenizer_size, model_size) if isinstance(model_size, int) else tokenizer_size


class Coordination:
    """Rank 0's side jobs: the coordinator and its gRPC server, weight broadcast, metrics log."""

    def __init__(
        self,
        cfg: worker_config.WorkerConfig,
        ident: identity.Identity,
        state: dict[str, Any] | None,
        prompt_budget: int,
        stop: threading.Event | None = None,
    ) -> None:
        import transformers

        spec = cfg.spec
        self.cfg = cfg
        tokenizer = transformers.AutoTokenizer.from_pretrained(spec.model.tokenizer or cfg.paths.model_dir)
        task = registry.from_spec(spec.task, cfg.paths.dataset_file)
        start = int(state["next_index"]) if state else 0
        source = tasks.to_prompts(task, tokenizer, spec.task.seed, start=start)
        g = spec.generation.samples_per_prompt
        self.coord = coordinator.Coordinator(
            source,
            coordinator.Config(
                samples_per_prompt=g,
                # One optimizer batch: generators fill the next batch while the trainers train on
                # this one, and no further (behind a full buffer a generator stops leasing once
                # `generator.max_unacked_groups` groups wait; every waiting group ages, and lag
                # costs learning per sample). Two batches raised the demo's mean lag from ~1.1 to ~2.
                buffer_groups=max(1, spec.training.batch_size // g),
                lease_timeout_s=max(60.0, spec.heartbeat.timeout_seconds * 4),
                vocab_size=_trainable_vocab(len(tokenizer), cfg.paths.model_dir),
                max_new_tokens=spec.generation.max_new_tokens,
                # No generator has less than one accelerator: more ids are not this job's.
                max_generators=spec.resources.total_gpus,
                prompt_budget=prompt_budget,
            ),
            state=state,
            skip_source=False,
        )
        _, port = worker_config.split_host_port(cfg.endpoints.coordinator)
        self.snapshots = snapshot.SnapshotStore()
        self.server = rpc_server.serve(
            self.coord,
            token=ident.token,
            snapshots=self.snapshots,
            host=ident.bind_host,
            port=port,
            call_limits=rpc_limits.for_job(spec.resources.total_gpus, ident.bind_host),
            tls=(ident.tls.key, ident.tls.cert) if ident.tls else None,
        )
        ws_host, ws_port = worker_config.split_host_port(cfg.endpoints.weight_sync)
        # gloo when generators may share this GPU (plrl run on fewer GPUs than the job's)
        backend = training.collective_backend(cfg.endpoints.collective_backend)
        self.broadcaster = sender.WeightBroadcaster(
            advertise_host=ws_host,
            port=ws_port,
            backend=backend,
            device="cuda" if backend == "nccl" else "cpu",
            snapshots=self.snapshots,
            abort=stop,  # a stopping trainer does not wait out the join timeout for generators
            bind_host=ident.bind_host,
        )
        self.metrics = metrics.WorkerMetrics("trainer")
        self.metrics.watch_coordinator(self.coord.stats)
        self.metrics_endpoint = self.metrics.serve(
            ident.metrics_port or cfg.endpoints.metrics_port, host=ident.bind_host
        )
        self.run_dir = pathlib.Path(cfg.paths.run_dir) if cfg.paths.run_dir else None
        # The clock starts when the first batch is in: worker start-up (imports, engine warm-up)
        # is a fixed cost that would otherwise dominate short runs and skew mode comparisons.
        self.started: float | None = None
        self.generated_tokens = 0
        self.trained_tokens = 0
        self.last_record: records.StepRecord | None = None  # read by the heartbeat thread

    def take(self, n_groups: int, stop: threading.Event) -> list[protocol.RolloutGroup]:
        groups: list[protocol.RolloutGroup] = []
        while len(groups) < n_groups and not stop.is_set():
            groups += self.coord.take(n_groups - len(groups), timeout_s=TAKE_TIMEOUT_S)
            if self.coord.stats().finished:
                break
        return groups

    def publish(self, engine: engines.TrainingEngine, announce: bool = True) -> None:
        """Send the engine's current weights to every generator (or, `announce=False`, only publish
        them for pulls)."""
        t0 = time.perf_counter()
        rep = self.broadcaster.broadcast(
            engine.version,
            engine.named_parameters_for_sync(),
            self.coord.weight_members() if announce else [],
            self.coord.announce_weights,
            self.coord.weight_member_connected,
        )
        for gen in rep.missed:
            self.coord.request_pull(gen, engine.version)
        self.metrics.weight_sync_seconds.observe(time.perf_counter() - t0)

    def log_step(
        self,
        step: int,
        batch: BatchStats,
        train_metrics: dict[str, float],
        step_s: float,
        busy_s: float,
    ) -> records.StepRecord:
        if self.started is None:
            self.started = time.monotonic() - busy_s
        elapsed = time.monotonic() - self.started
        trained = train_metrics.get("input_tokens", 0.0)
        self.generated_tokens += batch.completion_tokens
        self.trained_tokens += int(trained)
        record = records.StepRecord(
            step=step,
            version=int(train_metrics["version"]),
            elapsed_s=round(elapsed, 3),
            step_s=round(step_s, 4),
            busy_s=round(busy_s, 4),
            reward_mean=batch.reward_mean,
            lag_mean=batch.lag_mean,
            lag_max=batch.lag_max,
            mixed_version_samples=batch.mixed_version_samples,
            completion_tokens=batch.completion_tokens,
            # Whole-run averages (comparable between pipeline and conventional runs) ...
            generated_tokens_per_s=self.generated_tokens / elapsed if elapsed > 0 else 0.0,
            trained_tokens_per_s=self.trained_tokens / elapsed if elapsed > 0 else 0.0,
            # ... and what the trainers manage while busy (the autoscaler's r_train).
            train_busy_tokens_per_s=trained / busy_s if busy_s > 0 else 0.0,
            input_tokens=trained,
            loss=train_metrics["loss"],
            ess=train_metrics["ess"],
            prompts=self.coord.stats().accounting,
            details={k: v for k, v in train_metrics.items() if k not in _TYPED_METRICS},
        )
        if batch.reward_mean is not None:
            self.metrics.reward.set(batch.reward_mean)
        self.metrics.observe_lag(batch.lag_mean, batch.lag_max)
        self.metrics.weight_version.set(record.version)
        self.metrics.add_trained_tokens(int(trained))
        self.metrics.step_seconds.observe(step_s)
        self.last_record = record
        if self.run_dir is not None:
            with (self.run_dir / records.METRICS_FILE).open("a") as f:
                f.write(record.to_json() + "\n")
        return record

    def close(self, finished: bool) -> None:
        """Stop serving. Generators are told to stop only if the job is `finished`; otherwise (this
        trainer restarts: told to stop by its controller, or its group broke) their streams just
        end, which they read as the coordinator being gone: they reconnect to its successor."""
        if finished:
            self.coord.stop("training finished")
        else:
            self.coord.stop("the trainer is restarting", tell_generators=False)
        self.server.stop(grace_s=0.5)  # the acks of groups in flight; nothing else is served now
        self.broadcaster.close()
        self.metrics_endpoint.close()


def slow_window_s(spec: spec_mod.JobSpec) -> float:
    """How far back generators' completion rates are compared: several heartbeat timeouts, so a
    generator is judged slow on a trend, not on one long sequence."""
    return max(SLOW_WINDOW_MIN_S, 3.0 * spec.heartbeat.timeout_seconds)


def forget_steps_after(metrics_file: pathlib.Path, step: int) -> int:
    """Drop the rows of steps after `step` (the checkpoint a restart resumed from): the model forgot
    them and trains those steps again, so the file keeps one row per step of the final model's
    history. Returns how many rows were dropped."""
    if not metrics_file.exists():
        return 0
    rows = records.read_step_records(metrics_file.read_text())
    kept = [r for r in rows if r.step <= step]
    if len(kept) == len(rows):
        return 0
    tmp = metrics_file.with_suffix(".tmp")
    tmp.write_text("".join(r.to_json() + "\n" for r in kept))
    tmp.replace(metrics_file)
    log.info(
        "resumed at step %d: forgot %d later step row(s) of %s", step, len(rows) - len(kept), metrics_file
    )
    return len(rows) - len(kept)


def broadcast_groups(groups: list[protocol.RolloutGroup] | None, rank: int) -> list[protocol.RolloutGroup]:
    """Rank 0's batch on every rank (collective), sent as protobuf bytes in a uint8 tensor: the
    peers decode data, never unpickle it (`broadcast_object_list` would run whatever it was sent)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    data = rpc_convert.groups_to_bytes(groups or []) if rank == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    n = int(size.item())
    if n == 0:
        return []
    if rank == 0:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(n, dtype=torch.uint8, device=device)
    dist.broadcast(buf, src=0)
    if rank == 0:
        return groups or []
    return rpc_convert.groups_from_bytes(buf.cpu().numpy().tobytes())


class TrainLoop:
    """The optimizer-step loop every trainer rank runs; rank 0 also owns the `Coordination` hub.

    Pipeline mode calls `train_one` back to back and `publish` after every k steps; conventional
    mode (`conventional.py`) interleaves rounds of generation in the same processes.
    """

    def __init__(
        self,
        cfg: worker_config.WorkerConfig,
        ident: identity.Identity,
        ranks: RankInfo,
        stop: threading.Event,
        *,
        prompt_budget: int | None = None,
        engine: engines.TrainingEngine | None = None,
    ) -> None:
        """`engine`: None joins the trainer group at the config's rendezvous and builds the spec's
        backend; tests pass a fake, having joined a process group themselves (the loop broadcasts
        each batch to every rank with torch.distributed)."""
        spec = cfg.spec
        self.cfg, self.ranks, self.stop = cfg, ranks, stop
        if engine is None:
            host, port = worker_config.split_host_port(cfg.endpoints.rendezvous)
            training.init_distributed(
                training.Rendezvous(
                    host,
                    port,
                    ranks.rank,
                    ranks.world_size,
                    ranks.local_rank,
                    cfg.endpoints.collective_backend,
                    bind_host=ident.bind_host,
                )
            )
            engine = factory.training_engine(
                training.TrainEngineConfig.from_spec(spec, cfg.paths.model_dir, local_rank=ranks.local_rank)
            )
        elif not dist.is_initialized():
            raise RuntimeError("a TrainLoop given an engine needs a process group: training.init_distributed")
        self.engine = engine
        self.ckpt_root = pathlib.Path(cfg.paths.checkpoint_dir)
        self.ckpt_key = checkpoint_manifest.signing_key(ident.checkpoint_key or ident.token)
        meta = checkpoint.resume(self.engine, self.ckpt_root, key=self.ckpt_key)
        self.step = meta.step if meta else 0
        self.saved_step = self.step  # the step of the latest checkpoint (0: none)
        if meta:
            log.info("resumed from %s: step %d, weight version %d", self.ckpt_root, meta.step, meta.version)
        self.n_groups = spec.training.batch_size // spec.generation.samples_per_prompt
        self.total_steps = spec.training.total_steps
        budget = self.total_steps * self.n_groups if prompt_budget is None else prompt_budget
        state = meta.extra.get("coordinator") if meta else None
        self.hub = Coordination(cfg, ident, state, budget, stop) if ranks.rank == 0 else None
        if self.hub is not None:
            self.hub.coord.finish_step(self.engine.version)
            if self.hub.run_dir is not None:
                forget_steps_after(self.hub.run_dir / records.METRICS_FILE, self.step)
        self.rl_cfg = rl_step.RLConfig.from_spec(spec)
        self.closing = False
        self.out_of_prompts = False  # the prompt source ran dry before totalSteps
        # One Lease per pod, so only its first rank renews it; under `plrl run` every process beats.
        one_per_pod = ranks.local_rank == 0 or ident.pod_name is None
        self.heartbeat = heartbeat.start(cfg, ident, self.heartbeat_report) if one_per_pod else None

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps

    def heartbeat_report(self) -> records.WorkerReport:
        """This rank's Lease annotations; rank 0's carry the job's progress (called by the heartbeat)."""
        hub = self.hub
        if hub is None:
            return records.WorkerReport(role=names.TRAINER, weight_version=self.engine.version)
        return heartbeat.trainer_report(
            hub.last_record,
            step=self.step,
            weight_version=self.engine.version,
            # Only once the last step is checkpointed and the loop is shutting down: the operator
            # takes `finished` as the job having succeeded.
            finished=self.done and self.closing,
            tokens_per_second=hub.metrics.trained_tokens_per_second(),
            queue_depth=hub.coord.stats().accounting.buffered,
            slow_generators=hub.coord.slow_generators(),
        )

    def train_one(self) -> bool:
        """One optimizer step on B fresh samples; False if the job stopped before a full batch."""
        hub, engine = self.hub, self.engine
        t0 = time.perf_counter()
        groups = broadcast_groups(hub.take(self.n_groups, self.stop) if hub else None, self.ranks.rank)
        t_busy = time.perf_counter()
        if len(groups) < self.n_groups:
            self.out_of_prompts = not self.stop.is_set()
            why = "no more prompts" if self.out_of_prompts else "asked to stop"
            log.info("stopping at step %d: %s", self.step, why)
            # Every rank gets here together (rank 0 sent them all the short batch). Asked to stop, as
            # for a resize or a suspend, the group saves the step it reached, so its successor redoes
            # nothing; out of prompts, the last model is kept. No lease is granted after the state
            # is saved: a prompt leased later would be unknown to the successor, so a generator
            # could not hand it the group it finishes meanwhile (`Coordinator.lease(prompt_ids=)`).
            if hub is not None and not self.out_of_prompts:
                hub.coord.stop("the trainer is restarting", tell_generators=False)
            self.save_checkpoint()
            return False
        version = engine.version
        prepared = rl_step.prepare(groups, version, self.ranks.world_size, self.rl_cfg)
        if prepared.empty:
            # Every sample is older than maxLag. An optimizer step on zero gradients would still
            # move the weights (Adam momentum), so skip it; the prompts count as dropped_by_lag and
            # the next batch, fresher, is taken at the same weight version.
            log.warning(
                "step %d: all %d prompts of the batch dropped by the lag policy (maxLag %d); no step",
                self.step + 1,
                len(prepared.prompts_dropped),
                self.rl_cfg.max_lag,
            )
            if hub is not None:
                hub.coord.finish_step(version, dropped=prepared.prompts_dropped, stepped=False)
            return True
        out = rl_step.train_step(engine, prepared.micro_batches[self.ranks.rank], self.rl_cfg)
        out |= prepared.metrics()
        self.step += 1
        if hub is not None:
            hub.coord.finish_step(engine.version, dropped=prepared.prompts_dropped)
            policy = self.cfg.spec.failure_policy
            hub.coord.migrate_from_slow(policy.slow_generator_threshold, slow_window_s(self.cfg.spec))
            now = time.perf_counter()
            hub.log_step(self.step, BatchStats.of(groups, version), out, now - t0, now - t_busy)
        if self.step % self.cfg.spec.training.checkpoint.every_steps == 0 or self.done:
            self.save_checkpoint()
        return True

    def save_checkpoint(self) -> None:
        """Collective: checkpoint the current step (with rank 0's prompt accounting), unless it is
        saved already or nothing was trained."""
        if self.step == self.saved_step:
            return
        hub, ckpt = self.hub, self.cfg.spec.training.checkpoint
        extra = {"coordinator": hub.coord.export_state()} if hub else {}
        checkpoint.save(
            self.engine,
            self.ckpt_root,
            self.step,
            key=self.ckpt_key,
            extra=extra,
            keep=ckpt.keep,
            tokenizer_from=self.cfg.paths.model_dir,
        )
        self.saved_step = self.step

    def publish(self, announce: bool = True) -> None:
        """Rank 0: broadcast the current weights to the generators (collective with them)."""
        if self.hub is not None:
            self.hub.publish(self.engine, announce)

    def close(self) -> None:
        self.closing = True  # from now on the heartbeat says `finished` if the job is done
        if self.hub is not None:
            self.hub.close(finished=self.done or self.out_of_prompts)
        self.engine.close()
        if self.heartbeat is not None:
            if self.done:
                lifecycle.park(self.heartbeat, self.stop, f"trained all {self.total_steps} steps")
            self.heartbeat.stop()  # a last renewal


def train(
    cfg: worker_config.WorkerConfig, ident: identity.Identity, ranks: RankInfo, stop: threading.Event
) -> int:
    """Pipeline mode: train as rollouts arrive and send new weights every k steps."""
    loop = TrainLoop(cfg, ident, ranks, stop)
    sync_every = cfg.spec.pipeline.weight_sync_every_steps
    group_broke = False
    first = True
    try:
        loop.publish()  # no members yet: makes the current weights pullable (e.g. after a resume)
        while not loop.done:
            before = loop.step
            if not loop.train_one():
                break
            if first and loop.step != before:
                # Said once at INFO: after a restart or a resize it marks the group training again.
                first = False
                log.info("first step of this process trained: step %d", loop.step)
            if loop.step != before and (loop.step % sync_every == 0 or loop.done) and not stop.is_set():
                # The last version is only made pullable: generators stop once every prompt is
                # leased, so announcing it would wait out the join timeout for members already gone.
                loop.publish(announce=not loop.done)
    except RuntimeError as err:  # DistError is one
        if ranks.world_size == 1 or not training.is_group_failure(err):
            raise
        # A peer rank died (its failure is the one charged): this rank cannot go on alone, and the
        # group restarts from the latest checkpoint (`policy.decide.trainer_group`).
        log.error("the trainer group broke (%s: %s); exiting to restart with it", type(err).__name__, err)
        group_broke = True
    finally:
        loop.close()
    if group_broke:
        # Not `return`: the broken process group's destructors may abort the interpreter on its way
        # out (SIGABRT, "terminate called without an active exception"), charged as a crash.
        lifecycle.exit_now(names.EXIT_RESTART_ME)
    training.leave_distributed()
    return 0 if loop.done or stop.is_set() else 1


def spawn_local_ranks(argv: list[str], gpus: int) -> int:
    """A pod with several accelerators: one process per accelerator, torchrun-style."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "plrl_workers", *argv],
            env={**os.environ, names.ENV_LOCAL_RANK: str(local)},
        )
        for local in range(gpus)
    ]

    def forward_term(*_: object) -> None:
        for p in procs:
            p.terminate()

    signal.signal(signal.SIGTERM, forward_term)
    codes = [p.wait() for p in procs]
    return max(codes, key=abs)


def main(cfg: worker_config.WorkerConfig, ident: identity.Identity, argv: list[str]) -> int:
    """The trainer role (`plrl-worker --role trainer`; `argv` is what this process was started with)."""
    gpus = cfg.pods().gpus_per_trainer
    if ident.local_rank is None and gpus > 1:
        return spawn_local_ranks(argv, gpus)
    ranks = RankInfo.of(cfg, ident)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{ranks.rank} %(name)s %(levelname)s %(message)s"
    )
    stop = threading.Event()
    lifecycle.on_sigterm(stop.set)
    return train(cfg, ident, ranks, stop)
