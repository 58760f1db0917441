"""Discrete-event simulation of a job on N accelerators, to check the planner's closed forms.

Time is in flashes, like the model. Sequence lengths are sampled (seeded `random.Random`), so
stragglers, bursts of completions and lag come out of the simulation rather than the formulas.

- Conventional: each round, S = B * G sequences are dealt to the N accelerators; each decodes
  its share with a shrinking batch b (one decode step costs b / U(b) flashes) and the round
  waits for the slowest; then all N train the round's tokens at tau flashes per token per
  accelerator, R optimizer steps in a row (step r trains on samples r steps old).
- Pipeline: I generators keep H sequences each in flight (a finished one is replaced at once;
  a decode step costs H / U(H)). Finished sequences queue in a bounded buffer (generators stall
  when it is full: backpressure); the N - I trainers take B of them per optimizer step at
  (N - I) / tau tokens per flash. After each step the new weights are broadcast: generators
  pause `broadcast_flashes` and carry on with the same sequences (in-flight update), so a
  sequence's lag is the trainer's version when it is trained minus the version it started on.
- Autoscaled pipeline: the same, with `policy.autoscaler.decide` called after every step on
  measured capacities (optionally noisy); added generators start fresh sequences, removed ones
  lose their in-flight tokens (counted).

Pure compute, no I/O. Neighbours: `policy.planner` (the closed forms it is compared with),
`policy.autoscaler`, `simulate_cli` (`plrl simulate`: table and plot).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import random

from plrl_api import utilisation
from plrl_operator.policy import autoscaler, planner, types


@dataclasses.dataclass(frozen=True)
class SimConfig:
    n_gpus: int
    batch_size: int
    lengths: planner.Lengths
    curve: utilisation.Curve
    tau: float = planner.PAPER_TAU
    steps: int = 400
    seed: int = 0
    broadcast_flashes: float = 0.0
    """Pause per weight broadcast (generators and trainer), in flashes."""
    rescale_flashes: float = 0.0
    """Pause of everything when the autoscaler changes I, in flashes."""
    buffer_batches: float = 1.0
    """Rollout buffer capacity in batches of B sequences (beyond it generators stall); the runtime's
    is one batch (`trainer.py`)."""
    warmup_fraction: float = 1 / 3
    """Throughput is measured over the steps after this fraction of the run."""
    rate_noise: float = 0.0
    """Relative standard deviation of the rates the autoscaler is shown."""

    def __post_init__(self) -> None:
        if self.n_gpus < 2 or self.batch_size < 1 or self.steps < 1 or self.tau <= 0:
            raise planner.PlanError(
                f"simulation needs N >= 2, B >= 1, steps >= 1 and tau > 0; got N={self.n_gpus}, "
                f"B={self.batch_size}, steps={self.steps}, tau={self.tau}"
            )
        if min(self.broadcast_flashes, self.rescale_flashes, self.rate_noise) < 0 or self.buffer_batches < 1:
            raise planner.PlanError("pauses and noise must not be negative, and the buffer must hold a batch")


@dataclasses.dataclass(frozen=True)
class StepRecord:
    step: int
    time: float
    """Flashes from the start when the optimizer step finished."""
    tokens: int
    generators: int
    max_lag: int
    mean_lag: float


@dataclasses.dataclass(frozen=True)
class SimResult:
    mode: str
    n_gpus: int
    records: tuple[StepRecord, ...]
    throughput: float
    """Trained tokens per flash over the measured window."""
    decisions: tuple[types.Decision, ...] = ()
    lost_tokens: int = 0

    @property
    def max_lag(self) -> int:
        return max((r.max_lag for r in self.records), default=0)

    @property
    def generators(self) -> tuple[int, ...]:
        return tuple(r.generators for r in self.records)


def _window_throughput(records: list[StepRecord], first: int) -> float:
    """Tokens per flash trained by records[first:], timed from the end of records[first - 1]."""
    first = min(max(first, 0), len(records) - 1)
    t0 = records[first - 1].time if first else 0.0
    dt = records[-1].time - t0
    return sum(r.tokens for r in records[first:]) / dt if dt > 0 else 0.0


def _recent_step_time(records: list[StepRecord], k: int) -> float:
    """Mean time per step over the last `k` records (fewer at the start, timed from 0)."""
    first = max(len(records) - k, 0)
    t0 = records[first - 1].time if first else 0.0
    return (records[-1].time - t0) / (len(records) - first)


def simulate_conventional(cfg: SimConfig, steps_per_round: int) -> SimResult:
    rng = random.Random(cfg.seed)
    n, b, g = cfg.n_gpus, cfg.batch_size, steps_per_round
    u = cfg.curve.u
    t = 0.0
    records: list[StepRecord] = []
    rounds = max(1, math.ceil(cfg.steps / g))
    for _ in range(rounds):
        lens = [cfg.lengths.sample(rng) for _ in range(b * g)]
        slowest = 0.0
        for k in range(min(n, len(lens))):
            mine = sorted(lens[k::n])
            m, prev, spent = len(mine), 0, 0.0
            for j, length in enumerate(mine):
                if length > prev:
                    batch = m - j
                    spent += (length - prev) * batch / u(batch)
                    prev = length
            slowest = max(slowest, spent)
        t += slowest
        for j in range(g):
            tokens = sum(lens[j * b : (j + 1) * b])
            t += tokens * cfg.tau / n
            records.append(StepRecord(len(records) + 1, t, tokens, n, j, float(j)))
        t += cfg.broadcast_flashes  # the new weights go into the inference engine once per round
    # whole rounds only: a round's generation time belongs to all of its steps
    return SimResult("conventional", n, tuple(records), _window_throughput(records, 0))


class _Pipeline:
    """The event loop of a pipelined job (one instance per run)."""

    def __init__(self, cfg: SimConfig, generators: int, concurrency: int) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.h = concurrency
        self.decode = concurrency / cfg.curve.u(concurrency)  # flashes per decode step
        self.heap: list[tuple[float, int, int, int, int]] = []  # gen time, id, gpu, length, version
        self.alive: set[int] = set()
        self.next_gpu = 0
        self.seq_id = 0
        self.offset = 0.0  # wall time = generator time + offset (pauses and stalls push it)
        self.stalled_since: float | None = None
        self.resume_at = 0.0
        self.buffer: collections.deque[tuple[int, int]] = collections.deque()
        self.capacity = max(cfg.batch_size, math.ceil(cfg.buffer_batches * cfg.batch_size))
        self.generators = 0
        self.version = 0
        self.train_done: float | None = None
        self.train_free = 0.0
        self.batch: tuple[int, int, float] = (0, 0, 0.0)  # tokens, max lag, mean lag
        self.lost = 0
        self.add_generators(generators, 0.0)

    def gen_clock(self, now: float) -> float:
        return (self.stalled_since if self.stalled_since is not None else now) - self.offset

    def _start(self, gpu: int, gen_time: float) -> None:
        length = self.cfg.lengths.sample(self.rng)
        self.seq_id += 1
        heapq.heappush(self.heap, (gen_time + length * self.decode, self.seq_id, gpu, length, self.version))

    def add_generators(self, count: int, now: float) -> None:
        g0 = self.gen_clock(now)
        for _ in range(count):
            gpu, self.next_gpu = self.next_gpu, self.next_gpu + 1
            self.alive.add(gpu)
            for _ in range(self.h):
                self._start(gpu, g0)
        self.generators += count

    def remove_generators(self, count: int, now: float) -> None:
        gone = set(sorted(self.alive)[-count:])
        self.alive -= gone
        g_now = self.gen_clock(now)
        for gen_time, _, gpu, length, _ in self.heap:
            if gpu in gone:  # tokens decoded so far are thrown away with the generator
                self.lost += max(0, length - math.ceil((gen_time - g_now) / self.decode))
        self.generators -= count

    def try_train(self, now: float) -> None:
        b = self.cfg.batch_size
        if self.train_done is not None or len(self.buffer) < b:
            return
        taken = [self.buffer.popleft() for _ in range(b)]
        tokens = sum(length for length, _ in taken)
        lags = [self.version - v for _, v in taken]
        self.batch = (tokens, max(lags), sum(lags) / b)
        rate = (self.cfg.n_gpus - self.generators) / self.cfg.tau
        self.train_done = max(now, self.train_free) + tokens / rate
        if self.stalled_since is not None and len(self.buffer) < self.capacity:
            resume = max(now, self.resume_at)
            self.offset += resume - self.stalled_since
            self.stalled_since = None

    def next_generation(self) -> float:
        if self.stalled_since is not None or not self.heap:
            return math.inf
        return self.heap[0][0] + self.offset

    def finish_sequence(self, now: float) -> None:
        gen_time, _, gpu, length, version = heapq.heappop(self.heap)
        if gpu not in self.alive:
            return
        if len(self.buffer) >= self.capacity:  # backpressure: every generator waits for the trainer
            heapq.heappush(self.heap, (gen_time, 0, gpu, length, version))
            self.stalled_since = now
            return
        self.buffer.append((length, version))
        self._start(gpu, gen_time)
        self.try_train(now)

    def pause(self, now: float, flashes: float) -> None:
        if flashes <= 0:
            return
        self.train_free = max(self.train_free, now) + flashes
        if self.stalled_since is None:
            self.offset += flashes
        else:
            self.resume_at = max(self.resume_at, now) + flashes


def simulate_pipeline(
    cfg: SimConfig,
    generators: int,
    concurrency: int,
    policy: autoscaler.Policy | None = None,
) -> SimResult:
    """A pipelined run with fixed I, or autoscaled from I when `policy` is given."""
    if not 0 < generators < cfg.n_gpus:
        raise planner.PlanError(f"generators I={generators} must be in [1, N-1={cfg.n_gpus - 1}]")
    if policy is not None and policy.n_gpus != cfg.n_gpus:
        raise planner.PlanError(f"autoscale policy is for N={policy.n_gpus} GPUs, the run has N={cfg.n_gpus}")
    sim = _Pipeline(cfg, generators, concurrency)
    noise = random.Random(cfg.seed + 1)
    u_h = cfg.curve.u(concurrency)
    state = types.AutoscalerState()
    samples: collections.deque[types.RateSample] = collections.deque(maxlen=200)
    records: list[StepRecord] = []
    decisions: list[types.Decision] = []
    while len(records) < cfg.steps:
        t_train = sim.train_done if sim.train_done is not None else math.inf
        t_gen = sim.next_generation()
        if math.isinf(t_train) and math.isinf(t_gen):
            raise RuntimeError("simulation deadlocked: no generator and no trainer can make progress")
        if t_gen < t_train:
            sim.finish_sequence(t_gen)
            continue
        now = t_train
        sim.version += 1
        sim.train_done = None
        tokens, max_lag, mean_lag = sim.batch
        records.append(StepRecord(sim.version, now, tokens, sim.generators, max_lag, mean_lag))
        if policy is not None:

            def jitter() -> float:
                return max(0.0, 1 + noise.gauss(0, cfg.rate_noise)) if cfg.rate_noise else 1.0

            samples.append(
                types.RateSample(
                    step=sim.version,
                    generators=sim.generators,
                    gen_tokens_per_s=sim.generators * u_h * jitter(),
                    train_tokens_per_s=(cfg.n_gpus - sim.generators) / cfg.tau * jitter(),
                )
            )
            per_step = _recent_step_time(records, 10)
            # A change pauses everything `rescale_flashes`: what the last one cost, once there was one.
            cost = cfg.rescale_flashes if decisions and cfg.rescale_flashes > 0 else None
            obs = types.Observation(sim.version, sim.generators, tuple(samples), per_step, cost)
            decision = autoscaler.decide(policy, state, obs)
            state = decision.state
            if decision.changed:
                decisions.append(decision)
                delta = decision.generators - sim.generators
                if delta > 0:
                    sim.add_generators(delta, now)
                else:
                    sim.remove_generators(-delta, now)
                sim.pause(now, cfg.rescale_flashes)
        sim.pause(now, cfg.broadcast_flashes)
        sim.try_train(now)
    warm = int(len(records) * cfg.warmup_fraction)
    return SimResult(
        "autoscaled" if policy is not None else "pipeline",
        cfg.n_gpus,
        tuple(records),
        _window_throughput(records, warm),
        tuple(decisions),
        sim.lost,
    )


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """One cluster size: the closed-form plan beside the simulated runs."""

    plan: types.Plan
    conventional: SimResult
    pipeline: SimResult

    @property
    def speedup(self) -> float:
        return self.pipeline.throughput / self.conventional.throughput


def sweep(workloads: list[planner.Workload], curve: utilisation.Curve, cfg: SimConfig) -> list[SweepRow]:
    """Plan and simulate each workload (conventional and fixed-I pipeline at the planned H, I).

    A pipeline needs about g_max steps to fill, so each run lasts at least 3 g_max steps and is
    measured after its first third; conventional runs last whole rounds.
    """
    rows = []
    for w in workloads:
        p = planner.plan(w, curve)
        c = dataclasses.replace(cfg, n_gpus=w.n_gpus, batch_size=w.batch_size, lengths=w.lengths, tau=w.tau)
        conv_steps = max(w.steps_per_round, w.steps_per_round * round(cfg.steps / w.steps_per_round))
        conv = simulate_conventional(dataclasses.replace(c, steps=conv_steps), w.steps_per_round)
        c = dataclasses.replace(c, steps=max(cfg.steps, 3 * p.pipeline.g_max), warmup_fraction=1 / 3)
        pipe = simulate_pipeline(c, p.pipeline.generators, p.pipeline.concurrency)
        rows.append(SweepRow(p, conv, pipe))
    return rows
