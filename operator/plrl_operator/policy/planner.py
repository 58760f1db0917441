"""The throughput model of the PipelineRL paper (`seed/MODEL.md`) and the choice of I and H.

Units are the paper's: time in *flashes* (one token's forward pass at peak FLOP/s), throughput in
tokens per flash. Conventional RL alternates phases, so its rate is the harmonic combination of
the generation rate (all N accelerators decoding S/N sequences each, the batch shrinking as
sequences finish) and the training rate N / tau. PipelineRL runs both at once, so its rate is
the minimum of U(H) * I and (N - I) / tau; the planner picks the (H, I) that maximises it under a
lag limit, preferring the smallest lag among equally fast plans.

Neighbours: `policy.utilisation` (U(h)), `policy.types` (Plan), `policy.autoscaler` (shares the
feasible-I rules), `policy.simulator` (checks this model by simulation), `plan_cli` (`plrl plan`).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from typing import TYPE_CHECKING, Literal

from plrl_api import utilisation
from plrl_operator.policy import types

if TYPE_CHECKING:  # only annotations: `plrl plan` without a job file need not build the spec models
    from plrl_api import spec as spec_mod

# tau of the paper's worked example: conventional r_train = N / tau = 26.02 at N = 128 (about 61%
# training MFU, since a trained token costs about 3 forward passes). Used when the curve has none.
PAPER_TAU = 128 / 26.02
# Plans whose throughputs differ by less than this (relative) count as equally fast.
_TIE = 1e-9


class PlanError(ValueError):
    """Inputs the model cannot plan for; the message says which input and why, in one line."""


@dataclasses.dataclass(frozen=True)
class Lengths:
    """The distribution of generated sequence lengths (tokens), on [1, max_len].

    `uniform` is the paper's assumption (L / Lbar = 2); `fixed` makes every sequence max_len long.
    """

    max_len: int
    kind: Literal["uniform", "fixed"] = "uniform"

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise PlanError(f"max sequence length L={self.max_len} must be at least 1")

    @property
    def mean(self) -> float:
        return (self.max_len + 1) / 2 if self.kind == "uniform" else float(self.max_len)

    def survival(self, step: int) -> float:
        """P(length >= step): the fraction of sequences still decoding at decode step `step`."""
        if self.kind == "fixed":
            return 1.0 if step <= self.max_len else 0.0
        return max(0.0, (self.max_len - step + 1) / self.max_len)

    def sample(self, rng: random.Random) -> int:
        return rng.randint(1, self.max_len) if self.kind == "uniform" else self.max_len


@dataclasses.dataclass(frozen=True)
class Workload:
    """Everything the model needs about one job or cluster size."""

    n_gpus: int
    batch_size: int
    lengths: Lengths
    steps_per_round: int = 1
    """R for conventional RL: optimizer steps per generation round (S = B * R; the paper's G)."""
    tau: float = PAPER_TAU
    gpus_per_generator: int = 1
    gpus_per_trainer: int = 1
    max_lag: int | None = None
    """Largest allowed g_max in optimizer steps (None: no limit)."""
    generators: int | None = None
    """Fix I instead of choosing it."""
    concurrency: int | None = None
    """Fix H instead of choosing it."""
    min_generators: int = 1
    max_generators: int | None = None

    def __post_init__(self) -> None:
        n = self.n_gpus
        checks: list[tuple[bool, str]] = [
            (n > 0, f"total GPUs N={n} must be positive"),
            (self.batch_size > 0, f"batch size B={self.batch_size} must be positive"),
            (self.steps_per_round > 0, f"steps per round R={self.steps_per_round} must be positive"),
            (self.tau > 0 and math.isfinite(self.tau), f"tau={self.tau} must be a positive number"),
            (self.gpus_per_generator > 0, f"GPUs per generator={self.gpus_per_generator} must be positive"),
            (self.gpus_per_trainer > 0, f"GPUs per trainer={self.gpus_per_trainer} must be positive"),
            (self.max_lag is None or self.max_lag >= 0, f"max lag={self.max_lag} must not be negative"),
            (
                self.concurrency is None or self.concurrency > 0,
                f"concurrent sequences H={self.concurrency} must be positive",
            ),
            (
                n >= self.gpus_per_generator + self.gpus_per_trainer,
                f"N={n} GPUs cannot hold one generator ({self.gpus_per_generator} GPUs) and one trainer "
                f"({self.gpus_per_trainer} GPUs)",
            ),
        ]
        if self.generators is not None:
            i = self.generators
            checks += [
                (i > 0, f"generators I={i} must be positive"),
                (i < n, f"generators I={i} must be less than the total GPUs N={n} (trainers need GPUs)"),
                (
                    i % self.gpus_per_generator == 0,
                    f"generators I={i} must be a multiple of GPUs per generator={self.gpus_per_generator}",
                ),
                (
                    (n - i) % self.gpus_per_trainer == 0,
                    f"N - I = {n - i} trainer GPUs must be a multiple of GPUs per trainer="
                    f"{self.gpus_per_trainer}",
                ),
            ]
        for ok, message in checks:
            if not ok:
                raise PlanError(message)


# --------------------------------------------------------------------------- closed forms


def conventional_rates(
    n_gpus: int, batch_size: int, steps_per_round: int, lengths: Lengths, tau: float, curve: utilisation.Curve
) -> types.ConventionalRates:
    """r_gen = K / sum_l (h(l)/N) / U(h(l)/N), r_train = N / tau, r_conv = harmonic combination."""
    s = batch_size * steps_per_round
    per_gpu = s / n_gpus
    if lengths.kind == "fixed":
        t_gen = lengths.max_len * per_gpu / curve.u(per_gpu)
    else:
        t_gen = 0.0
        for step in range(1, lengths.max_len + 1):
            x = per_gpu * lengths.survival(step)
            t_gen += x / curve.u(x)
    r_gen = s * lengths.mean / t_gen
    r_train = n_gpus / tau
    return types.ConventionalRates(
        r_gen=r_gen,
        r_train=r_train,
        r_conv=1.0 / (1.0 / r_gen + 1.0 / r_train),
        steps_per_round=steps_per_round,
        max_lag=steps_per_round - 1,
    )


def lag_steps(concurrency: int, generators: int, batch_size: int, lengths: Lengths) -> float:
    """H * I * L / (Lbar * B): optimizer steps that pass while a longest sequence is decoded."""
    return concurrency * generators * lengths.max_len / (lengths.mean * batch_size)


def g_max(concurrency: int, generators: int, batch_size: int, lengths: Lengths) -> int:
    return math.ceil(lag_steps(concurrency, generators, batch_size, lengths) - _TIE)


def pipeline_rates(
    n_gpus: int,
    generators: int,
    concurrency: int,
    batch_size: int,
    lengths: Lengths,
    tau: float,
    curve: utilisation.Curve,
) -> types.PipelineRates:
    u = curve.u(concurrency)
    r_gen = u * generators
    r_train = (n_gpus - generators) / tau
    lag = lag_steps(concurrency, generators, batch_size, lengths)
    return types.PipelineRates(
        generators=generators,
        concurrency=concurrency,
        utilisation=u,
        r_gen=r_gen,
        r_train=r_train,
        r_pipeline=min(r_gen, r_train),
        lag_steps=lag,
        g_max=math.ceil(lag - _TIE),
    )


# --------------------------------------------------------------------------- feasible I


def allowed_generators(
    n_gpus: int,
    gpus_per_generator: int = 1,
    gpus_per_trainer: int = 1,
    min_generators: int = 1,
    max_generators: int | None = None,
) -> list[int]:
    """Every I the cluster can run: whole generator pods, whole trainer pods, within the bounds."""
    hi = n_gpus - gpus_per_trainer if max_generators is None else min(max_generators, n_gpus - 1)
    first = max(min_generators, gpus_per_generator)
    first += -first % gpus_per_generator
    return [i for i in range(first, hi + 1, gpus_per_generator) if (n_gpus - i) % gpus_per_trainer == 0]


def lag_cap(concurrency: int, batch_size: int, lengths: Lengths, max_lag: int | None) -> float:
    """The largest I (not rounded) whose g_max stays within max_lag at this H."""
    if max_lag is None:
        return math.inf
    return max_lag * batch_size * lengths.mean / (concurrency * lengths.max_len) * (1 + _TIE)


def _best_for_h(w: Workload, h: int, u: float, feasible: list[int]) -> tuple[float, float, int] | None:
    """(r_pipeline, lag, I) of the best I at this H, or None if no I is feasible."""
    cap = lag_cap(h, w.batch_size, w.lengths, w.max_lag)
    k_cap = bisect.bisect_right(feasible, cap)
    if k_cap == 0:
        return None
    # r_pipeline(I) rises (generation-bound) then falls (training-bound): the best I is one of
    # the two feasible neighbours of the balance point N / (1 + tau U).
    balance = w.n_gpus / (1 + w.tau * u)
    k = bisect.bisect_left(feasible, balance, 0, k_cap)
    best: tuple[float, float, int] | None = None
    for i in feasible[max(0, k - 1) : min(k + 1, k_cap)]:
        r = min(u * i, (w.n_gpus - i) / w.tau)
        lag = lag_steps(h, i, w.batch_size, w.lengths)
        if best is None or _better(r, lag, best[0], best[1]):
            best = (r, lag, i)
    return best


def _better(r: float, lag: float, best_r: float, best_lag: float) -> bool:
    if r > best_r * (1 + _TIE):
        return True
    return r >= best_r * (1 - _TIE) and lag < best_lag * (1 - _TIE)


def plan(w: Workload, curve: utilisation.Curve) -> types.Plan:
    """The fastest (H, I) under the lag limit, and conventional RL on the same cluster."""
    if w.generators is not None:
        feasible = [w.generators]
    else:
        feasible = allowed_generators(
            w.n_gpus, w.gpus_per_generator, w.gpus_per_trainer, w.min_generators, w.max_generators
        )
        if not feasible:
            raise PlanError(
                f"no generator count fits N={w.n_gpus} with min generators={w.min_generators}, "
                f"max generators={w.max_generators}, {w.gpus_per_generator} GPUs per generator and "
                f"{w.gpus_per_trainer} per trainer"
            )
    hs = [w.concurrency] if w.concurrency is not None else range(1, int(curve.h_max) + 1)
    best: tuple[float, float, int] | None = None
    best_h = 0
    for h in hs:
        found = _best_for_h(w, h, curve.u(h), feasible)
        if found is not None and (best is None or _better(found[0], found[1], best[0], best[1])):
            best, best_h = found, h
    if best is None:
        h0, i0 = hs[0], feasible[0]
        raise PlanError(
            f"no generator count satisfies max lag {w.max_lag}: even H={h0}, I={i0} gives "
            f"g_max={g_max(h0, i0, w.batch_size, w.lengths)} optimizer steps at B={w.batch_size}; "
            "raise the max lag or the batch size, or lower H"
        )
    i = best[2]
    pipe = pipeline_rates(w.n_gpus, i, best_h, w.batch_size, w.lengths, w.tau, curve)
    conv = conventional_rates(w.n_gpus, w.batch_size, w.steps_per_round, w.lengths, w.tau, curve)
    return types.Plan(
        n_gpus=w.n_gpus,
        batch_size=w.batch_size,
        max_len=w.lengths.max_len,
        mean_len=w.lengths.mean,
        tau=w.tau,
        curve=curve.name,
        conventional=conv,
        pipeline=pipe,
        generator_pods=i // w.gpus_per_generator,
        trainer_pods=(w.n_gpus - i) // w.gpus_per_trainer,
        balance_generators=w.n_gpus / (1 + w.tau * pipe.utilisation),
        max_lag_limit=w.max_lag,
    )


# --------------------------------------------------------------------------- jobs


def workload_for_job(
    job: spec_mod.JobSpec,
    curve: utilisation.Curve | None = None,
    *,
    steps_per_round: int = 1,
    fixed_generators: bool = False,
) -> Workload:
    """The job's model inputs: N, B, L, H, lag limit, pod sizes and autoscale bounds from the spec."""
    r, p = job.resources, job.pipeline
    tau = curve.tau if curve is not None and curve.tau is not None else PAPER_TAU
    return Workload(
        n_gpus=r.total_gpus,
        batch_size=job.training.batch_size,
        lengths=Lengths(job.generation.max_new_tokens),
        steps_per_round=steps_per_round,
        tau=tau,
        gpus_per_generator=r.gpus_per_generator,
        gpus_per_trainer=r.gpus_per_trainer,
        max_lag=p.max_lag,
        generators=p.generators if fixed_generators else None,
        concurrency=job.generation.concurrent_sequences,
        min_generators=p.autoscale.min_generators,
        max_generators=p.autoscale.max_generators,
    )


def seed_generators(w: Workload) -> int:
    """The seed's `min(N // 3, 64)`, snapped to whole pods, the bounds and (if it can) the lag limit."""
    allowed = allowed_generators(
        w.n_gpus, w.gpus_per_generator, w.gpus_per_trainer, w.min_generators, w.max_generators
    )
    if not allowed:  # bounds exclude everything: whole pods matter more than the bounds
        allowed = allowed_generators(w.n_gpus, w.gpus_per_generator, w.gpus_per_trainer)
    if w.concurrency is not None:
        cap = lag_cap(w.concurrency, w.batch_size, w.lengths, w.max_lag)
        allowed = [i for i in allowed if i <= cap] or allowed[:1]
    want = min(w.n_gpus // 3, 64)
    k = bisect.bisect_right(allowed, want)
    return allowed[k - 1] if k else allowed[0]


def initial_generators(job: spec_mod.JobSpec, curve: utilisation.Curve | None = None) -> int:
    """I for a new job: the spec's value; else the planner's optimum when a curve is known;
    else the seed's `min(N // 3, 64)`. Always whole generator pods, leaving whole trainer pods.
    """
    if job.pipeline.generators is not None:
        return job.pipeline.generators
    w = workload_for_job(job, curve)
    if curve is not None:
        try:
            return plan(w, curve).pipeline.generators
        except PlanError:
            pass  # the lag limit admits no I at this H: fall back to the seed's rule
    return seed_generators(w)
