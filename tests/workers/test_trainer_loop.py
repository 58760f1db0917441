"""The trainer loop (`trainer.TrainLoop`) of rank 0 with a fake training engine, and its records read back.

The engine is a fake written here: one rank over the built-in tiny model, so `rl.step.train_step`
runs the real loss forward and backward, with a plain SGD update, counting optimizer steps and
weight versions itself (no DDP, no DeepSpeed). Everything else is real: the coordinator and its
gRPC server, the weight broadcaster (no members: it only publishes for pulls), the prompt source
(`builtin:arith` through the tiny tokenizer) and the checkpoints. Rollouts go in the way a generator's
do, by lease and submit on the coordinator, with token versions chosen so `pipeline.maxLag` bites.

One run serves all tests (4 batches of B/G = 2 groups, maxLag 1, totalSteps 3, a checkpoint every
2 steps): batch A at version 0, batch B at version 0 (lag 1: trained), batch C at version 0 once
the trainer is at 2 (lag 2: skipped), batch D with tokens of versions 1 and 2.

Cases:
- a batch whose every sample is older than maxLag is skipped: no optimizer step, no record, no
  weight version, its prompts counted as dropped_by_lag, and the loop goes on to train the next,
  fresh batch;
- each optimizer step writes a `StepRecord` to the run directory's metrics.jsonl whose numbers are
  those of the batch trained (reward, lag, version mixing, tokens, prompt accounting, the engine's
  grad norm); checkpoints every `checkpoint.everySteps` and at the last step carry the
  coordinator's accounting; the final weights are published for pulls;
- the records the loop really wrote, read back by every reader: `plrl run`'s report (records,
  summary, progress line), the heartbeat's Lease annotations and the operator's status
  (`progress_from_leases`, `compute_status`: STEP, LAG, REWARD, Succeeded once the loop closed),
  so renaming or re-mapping a field on the writing side fails here.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import pathlib
import threading
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist

from plrl_api import identity, names, plan, records, spec, worker_config
from plrl_operator import status
from plrl_operator.local import report
from plrl_operator.policy import decide
from plrl_workers import checkpoint, heartbeat, protocol, trainer
from plrl_workers.coordinator import core as coordinator
from plrl_workers.engines import training
from plrl_workers.models import tiny
from tests import samples
from tests.infra import procs

G = 2
B = 4  # samples per optimizer batch: B / G = 2 groups
MAX_LAG = 1
TOTAL_STEPS = 3
LR = 1e-3
GEN = "gen-0"
T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


class FakeTrainingEngine:
    """A `TrainingEngine` of one rank: the real tiny model forward and backward, a plain SGD update,
    and its own step and version counters (`optimizer_steps`, `grad_norms`: one per step)."""

    def __init__(self, model_dir: pathlib.Path) -> None:
        self._model = training.load_model(training.TrainEngineConfig(model_path=str(model_dir)), self.device)
        self._opt = torch.optim.SGD(self._model.parameters(), lr=LR)
        self._version = 0
        self.micro_batches = 0
        self.grad_norms: list[float] = []
        self.closed = False

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def version(self) -> int:
        return self._version

    @property
    def optimizer_steps(self) -> int:
        return len(self.grad_norms)

    def train_micro_batch(
        self,
        compute_loss: Callable[[torch.nn.Module], tuple[torch.Tensor, dict[str, float]]],
        *,
        last: bool,
    ) -> dict[str, float]:
        loss, metrics = compute_loss(self._model)
        torch.autograd.backward(loss)
        self.micro_batches += 1
        return metrics

    def step(self, behaviour_version: int | None = None) -> dict[str, float]:
        grads = [p.grad for p in self._model.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads))
        self._opt.step()
        self._opt.zero_grad(set_to_none=True)
        self._version += 1
        self.grad_norms.append(norm)
        return {"grad_norm": norm, "lr": LR}

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in self._model.named_parameters():
            yield name, p.detach()

    def save_checkpoint(self, directory: pathlib.Path) -> None:
        self._model.save_pretrained(str(directory / "model"), safe_serialization=True)  # type: ignore[operator]
        (directory / "engine.json").write_text(json.dumps({"version": self._version}))

    def load_checkpoint(self, directory: pathlib.Path) -> None:
        training.load_hf_weights(self._model, directory / "model")
        self._version = int(json.loads((directory / "engine.json").read_text())["version"])

    def close(self) -> None:
        self.closed = True


def _job() -> spec.PipelineRLJob:
    return samples.job(
        {
            "model": {"name": "builtin:tiny", "dtype": "float32"},
            "task": {"name": "builtin:arith"},
            "resources": {"totalGPUs": 2},
            "generation": {"engine": "torch", "maxNewTokens": 8, "samplesPerPrompt": G},
            "training": {
                "backend": "torch",
                "batchSize": B,
                "learningRate": LR,
                "tokensPerMicroBatch": 512,
                "totalSteps": TOTAL_STEPS,
                "checkpoint": {"everySteps": 2},
            },
            "pipeline": {"maxLag": MAX_LAG},
        },
        name="small",
        uid="uid-1",
    )


def _config(
    job: spec.PipelineRLJob, model_dir: pathlib.Path, run_dir: pathlib.Path
) -> worker_config.WorkerConfig:
    """Trainer rank 0's config as `plrl run` writes it: loopback endpoints, run-directory paths."""
    host = "127.0.0.1"
    return worker_config.build(
        job,
        plan.PodPlan.of(job.spec, 1),
        names.TRAINER,
        worker_config.Endpoints(
            coordinator=f"{host}:{procs.free_port()}",
            rendezvous=f"{host}:{procs.free_port()}",
            weight_sync=f"{host}:{procs.free_port()}",
            metrics_port=0,
        ),
        worker_config.Paths(
            model_dir=str(model_dir), checkpoint_dir=str(run_dir / "checkpoints"), run_dir=str(run_dir)
        ),
    )


@dataclasses.dataclass(frozen=True)
class Batch:
    """What the generator sends for one optimizer batch: per group, per sample (reward, versions)."""

    samples: tuple[tuple[tuple[float, tuple[int, ...]], ...], ...]

    @staticmethod
    def uniform(rewards: tuple[float, ...], versions: tuple[int, ...]) -> Batch:
        return Batch(tuple(tuple((r, versions) for r in rewards) for _ in range(B // G)))

    @property
    def flat(self) -> list[tuple[float, tuple[int, ...]]]:
        return [s for group in self.samples for s in group]

    @property
    def reward_mean(self) -> float:
        return sum(r for r, _ in self.flat) / len(self.flat)

    def lag_mean(self, trainer_version: int) -> float:
        versions = [v for _, vs in self.flat for v in vs]
        return trainer_version - sum(versions) / len(versions)

    @property
    def completion_tokens(self) -> int:
        return sum(len(vs) for _, vs in self.flat)


A = Batch.uniform((1.0, 0.0), (0, 0, 0))  # trained at version 0: lag 0
BB = Batch.uniform((0.5, 0.0), (0, 0, 0, 0))  # trained at version 1: lag 1 = maxLag, kept
C = Batch.uniform((1.0, 0.0), (0, 0, 0))  # offered at version 2: lag 2 > maxLag, skipped
D = Batch.uniform((1.0, 0.5), (1, 2))  # trained at version 2: tokens of two versions per sample


def _submit(coord: coordinator.Coordinator, leases: list[protocol.Lease], batch: Batch) -> int:
    """Send one rollout group per lease (as a generator would); returns the tokens trained on."""
    trained_tokens = 0
    for lease, group in zip(leases, batch.samples, strict=True):
        samples = []
        for j, (reward, versions) in enumerate(group):
            ids = [20 + (j + k) % 10 for k in range(len(versions))]
            samples.append(
                protocol.Sample(
                    token_ids=ids,
                    logprobs=[-4.0] * len(ids),
                    versions=list(versions),
                    reward=reward,
                    finish_reason="length",
                )
            )
            trained_tokens += len(lease.prompt.token_ids) + len(ids)
        result = coord.submit(
            protocol.RolloutGroup(
                lease_id=lease.lease_id,
                prompt_id=lease.prompt.prompt_id,
                prompt_token_ids=list(lease.prompt.token_ids),
                samples=samples,
                generator_id=GEN,
            )
        )
        assert result.ok, result
    return trained_tokens


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@dataclasses.dataclass
class Run:
    """What the one scenario run left behind, and what was observed along the way."""

    loop: trainer.TrainLoop
    engine: FakeTrainingEngine
    run_dir: pathlib.Path
    leases: dict[str, list[protocol.Lease]]
    trained_tokens: dict[str, int]
    skipped: bool
    """What `train_one()` returned for the stale batch C."""
    around_skip: tuple[tuple[int, int, int, int], tuple[int, int, int, int]]
    """(loop step, engine version, optimizer steps, metrics lines) before and after batch C."""
    stale_stats: records.PromptCounts
    log: list[str]
    report_running: records.WorkerReport
    report_closed: records.WorkerReport
    published: dict[str, torch.Tensor]
    final_params: dict[str, torch.Tensor]


def _lines(run_dir: pathlib.Path) -> int:
    path = run_dir / records.METRICS_FILE
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    model_dir = tiny.build(tmp_path_factory.mktemp("tiny"))
    run_dir = tmp_path_factory.mktemp("run")
    joined = not dist.is_initialized()
    training.init_distributed(None)  # a group of one: the loop broadcasts each batch to every rank
    messages = _Messages()
    logging.getLogger("plrl.trainer").addHandler(messages)
    engine = FakeTrainingEngine(model_dir)
    loop = trainer.TrainLoop(
        _config(_job(), model_dir, run_dir),
        identity.Identity(token="tok", bind_host="127.0.0.1"),
        trainer.RankInfo(rank=0, world_size=1, local_rank=0),
        threading.Event(),
        engine=engine,
    )
    try:
        assert loop.hub is not None
        coord = loop.hub.coord
        coord.register(GEN)
        # A, B and C are leased up front (C's rollouts come back late); D once C is dropped.
        out = coord.lease(GEN, 3 * B // G).leases
        leases = {"A": out[0:2], "B": out[2:4], "C": out[4:6]}
        tokens = {"A": _submit(coord, leases["A"], A)}
        assert loop.train_one() and loop.step == 1
        tokens["B"] = _submit(coord, leases["B"], BB)
        assert loop.train_one() and loop.step == 2
        _submit(coord, leases["C"], C)
        before = (loop.step, engine.version, engine.optimizer_steps, _lines(run_dir))
        skipped = loop.train_one()
        after = (loop.step, engine.version, engine.optimizer_steps, _lines(run_dir))
        stale_stats = coord.stats().accounting
        leases["D"] = coord.lease(GEN, B // G).leases  # the dropped prompts' budget is free again
        tokens["D"] = _submit(coord, leases["D"], D)
        assert loop.train_one() and loop.step == TOTAL_STEPS and loop.done
        loop.publish()
        running = loop.heartbeat_report()
        snap = loop.hub.snapshots.latest()
        assert snap is not None and snap.version == engine.version
        published = {n: t.clone() for n, t in snap.named_tensors()}
        final = {n: t.clone() for n, t in engine.named_parameters_for_sync()}
    finally:
        loop.close()
        logging.getLogger("plrl.trainer").removeHandler(messages)
    yield Run(
        loop=loop,
        engine=engine,
        run_dir=run_dir,
        leases=leases,
        trained_tokens=tokens,
        skipped=skipped,
        around_skip=(before, after),
        stale_stats=stale_stats,
        log=messages.messages,
        report_running=running,
        report_closed=loop.heartbeat_report(),
        published=published,
        final_params=final,
    )
    if joined:
        dist.destroy_process_group()


def test_a_batch_older_than_max_lag_is_skipped_and_the_next_one_trained(run: Run) -> None:
    assert run.skipped  # the loop goes on
    before, after = run.around_skip
    assert before == after == (2, 2, 2, 2)  # no step, no version, no optimizer step, no record
    c = run.stale_stats
    assert (c.trained, c.dropped_by_lag, c.in_training, c.buffered) == (4, 2, 0, 0) and c.balanced
    skip = f"step 3: all 2 prompts of the batch dropped by the lag policy (maxLag {MAX_LAG}); no step"
    assert skip in run.log
    # The next, fresh batch was trained: three optimizer steps in all, four batches offered.
    assert run.engine.optimizer_steps == TOTAL_STEPS and run.engine.version == TOTAL_STEPS
    final = report.read_records(run.run_dir)[-1]
    assert (final.step, final.version, final.prompts.dropped_by_lag) == (3, 3, 2)


def test_each_step_writes_the_record_of_the_batch_it_trained_and_checkpoints(run: Run) -> None:
    rows = records.read_step_records((run.run_dir / records.METRICS_FILE).read_text())
    assert [(r.step, r.version) for r in rows] == [(1, 1), (2, 2), (3, 3)]
    for row, batch, at, name in zip(rows, (A, BB, D), (0, 1, 2), ("A", "B", "D"), strict=True):
        assert row.reward_mean == pytest.approx(batch.reward_mean)
        assert row.lag_mean == pytest.approx(batch.lag_mean(at))
        assert row.completion_tokens == batch.completion_tokens
        assert row.input_tokens == run.trained_tokens[name]
        assert row.details["grad_norm"] == pytest.approx(run.engine.grad_norms[row.step - 1])
        assert row.details["lr"] == LR
        assert 0 < row.ess <= 1 and math.isfinite(row.loss)
        assert 0 < row.busy_s <= row.step_s
    assert [r.lag_max for r in rows] == [0, 1, 1]
    assert [r.mixed_version_samples for r in rows] == [0, 0, B]
    assert [r.elapsed_s for r in rows] == sorted(r.elapsed_s for r in rows)
    generated = sum(b.completion_tokens for b in (A, BB, D))
    assert rows[-1].generated_tokens_per_s == pytest.approx(generated / rows[-1].elapsed_s, rel=0.05)
    assert [r.prompts for r in rows] == [
        records.PromptCounts(issued=6, trained=2, leased=4),
        records.PromptCounts(issued=6, trained=4, leased=2),
        records.PromptCounts(issued=8, trained=6, dropped_by_lag=2),
    ]
    assert run.loop.hub is not None and rows[-1] == run.loop.hub.last_record
    # Checkpoints after step 2 (everySteps) and at the last step, with the coordinator's accounting.
    ckpts = checkpoint.checkpoints(run.run_dir / "checkpoints")
    assert [p.name for p in ckpts] == ["step-00000002", "step-00000003"]
    metas = [checkpoint.read_meta(p) for p in ckpts]
    assert [(m.step, m.version) for m in metas] == [(2, 2), (3, 3)]
    saved = [m.extra["coordinator"] for m in metas]
    assert [(c["trained"], c["dropped_by_lag"]) for c in saved] == [(4, 0), (6, 2)]
    assert (ckpts[-1] / "model" / "tokenizer.json").is_file()  # a generator can load it as a model
    # The final weights are what a generator pulls.
    assert list(run.published) == list(run.final_params)
    assert all(torch.equal(run.published[n], t) for n, t in run.final_params.items())


def test_the_records_the_loop_wrote_read_back_through_every_reader(run: Run) -> None:
    rows = report.read_records(run.run_dir)
    last = rows[-1]
    # `plrl run`: the summary and the progress line.
    summary = report.summarize(rows)
    assert summary.steps == TOTAL_STEPS
    assert summary.reward_first_10pct == pytest.approx(A.reward_mean)
    assert summary.reward_last_10pct == pytest.approx(D.reward_mean)
    assert summary.lag_mean == pytest.approx((A.lag_mean(0) + BB.lag_mean(1) + D.lag_mean(2)) / 3)
    assert (summary.lag_max, summary.mixed_version_samples) == (1, B)
    assert summary.prompts == records.PromptCounts(issued=8, trained=6, dropped_by_lag=2)
    assert "prompts: issued 8, trained 6, dropped_by_lag 2" in report.summary_text(summary)
    assert report.progress_line(last, TOTAL_STEPS).startswith("step 3/3  reward 0.75  lag 0.5 (max 1)  gen ")
    # The cluster: the heartbeat's Lease, read by the operator.
    tgt = heartbeat.Target("ns", "small-train-0", "small", "uid-1", names.TRAINER, 1.0, 10.0)
    lease = heartbeat.lease(tgt, run.report_running, now=T0, acquired=T0)
    ann = lease["metadata"]["annotations"]
    assert ann[names.ANNOTATION_WEIGHT_VERSION] == "3"
    assert ann[names.ANNOTATION_QUEUE_DEPTH] == "0"
    assert float(ann[names.ANNOTATION_UTILISATION]) == pytest.approx(last.busy_s / last.step_s, abs=1e-3)
    want = records.Progress(
        step=3,
        weight_version=3,
        lag=records.Lag(mean=D.lag_mean(2), max=1),
        reward=D.reward_mean,
        throughput=records.Throughput(
            generated_tokens_per_second=last.generated_tokens_per_s,
            trained_tokens_per_second=last.trained_tokens_per_s,
            ratio=last.trained_tokens_per_s / last.generated_tokens_per_s,
        ),
        finished=False,
    )
    assert status.progress_from_leases([lease]) == want
    # Once the loop has closed (last step trained and checkpointed) the job reads as Succeeded, with
    # the columns `kubectl get plrljobs` shows filled from the last record.
    job = _job()
    pod = {
        "metadata": {
            "name": "small-train-0",
            "uid": "p1",
            "labels": {names.LABEL_ROLE: names.TRAINER},
            "creationTimestamp": "2026-01-01T11:00:00Z",
        }
    }
    closed = heartbeat.lease(tgt, run.report_closed, now=T0, acquired=T0)
    children = status.Children(pods=[pod], leases=[closed])
    verdict = decide.decide(job.spec, status.observation(children), decide.History())
    s = status.compute_status(job, 1, children, status.JobStatus(phase="Running"), T0, verdict.history)
    assert s.phase == "Succeeded"
    assert (s.step, s.weight_version, s.lag, s.reward) == (3, 3, want.lag, want.reward)
    # The table shows rates to 1 tok/s and the ratio to 0.001.
    assert s.throughput == records.Throughput(
        generated_tokens_per_second=round(want.throughput.generated_tokens_per_second),
        trained_tokens_per_second=round(want.throughput.trained_tokens_per_second),
        ratio=round(want.throughput.ratio, 3),
    )


def test_an_injected_engine_needs_a_process_group(tmp_path: pathlib.Path, run: Run) -> None:
    # `run` joined a group of one; leave it for this check and join again after.
    dist.destroy_process_group()
    try:
        with pytest.raises(RuntimeError, match="needs a process group"):
            trainer.TrainLoop(
                _config(_job(), tmp_path, tmp_path),
                identity.Identity(token="tok", bind_host="127.0.0.1"),
                trainer.RankInfo(rank=0, world_size=1, local_rank=0),
                threading.Event(),
                engine=run.engine,
            )
    finally:
        training.init_distributed(None)


def test_asked_to_stop_between_checkpoints_it_saves_the_step_it_reached_and_its_successor_resumes_there(
    tmp_path: pathlib.Path, run: Run
) -> None:
    """As when a resize or a suspend deletes the trainer pods (SIGTERM): nothing trained is redone,
    and the prompts in flight come back to the successor's queue."""
    model_dir = tiny.build(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    cfg = _config(_job(), model_dir, run_dir)  # a checkpoint every 2 steps
    ident = identity.Identity(token="tok", bind_host="127.0.0.1")
    rank0 = trainer.RankInfo(rank=0, world_size=1, local_rank=0)
    stop = threading.Event()
    loop = trainer.TrainLoop(cfg, ident, rank0, stop, engine=FakeTrainingEngine(model_dir))
    try:
        assert loop.hub is not None
        coord = loop.hub.coord
        coord.register(GEN)
        _submit(coord, coord.lease(GEN, B // G).leases, A)
        assert loop.train_one() and loop.step == 1
        assert checkpoint.checkpoints(run_dir / "checkpoints") == []
        in_flight = sorted(lease.prompt.prompt_id for lease in coord.lease(GEN, B // G).leases)
        stop.set()
        assert not loop.train_one()
    finally:
        loop.close()
    (saved,) = checkpoint.checkpoints(run_dir / "checkpoints")
    assert checkpoint.read_meta(saved).step == 1

    # The successor (another process in a new pod) listens on ports of its own, in the same directories.
    cfg = _config(_job(), model_dir, run_dir)
    again = trainer.TrainLoop(cfg, ident, rank0, threading.Event(), engine=FakeTrainingEngine(model_dir))
    try:
        assert again.hub is not None and again.step == 1
        again.hub.coord.register(GEN)
        requeued = again.hub.coord.lease(GEN, B // G).leases
        assert sorted(lease.prompt.prompt_id for lease in requeued) == in_flight
    finally:
        again.close()
