"""When to change I (generator accelerators) while a job runs: the seed's rule, arbitrated by the planner.

Every `everySteps` optimizer steps the autoscaler averages the measured generator and trainer
*capacities* (tokens per busy second) and reads them twice:

- the seed's band: ratio = r_pipeline / r_gen below `lowerRatio` says the trainers are the
  bottleneck (remove `stepDown`), above `upperRatio` that generation's surplus is too thin (add
  `stepUp`), in between hold;
- the planner's optimum for those capacities: the allowed I with the most throughput
  min(I * per-generator rate, (N - I) * per-trainer rate).

The move follows the planner: one bounded step toward the optimum (at most stepUp/stepDown GPUs,
or one whole pod, never past it) when the optimum gains at least `min_gain`; where the band says
otherwise (it keeps generation 5-10% ahead, which costs throughput when the rates are capacities)
the reason says so. Around that:

- hard limits: whole generator and trainer pods, min/max generators and the model's g_max
  limit (`planner.lag_cap`) are never crossed; a current I outside them is moved inside at once;
- cool-down: no change within `cooldownSteps` of the last one, and only samples taken after it
  (at the current I) count; the longer I stays put, the more of them the estimate averages;
- warm-up: the first `warmupSteps` steps after the start or a change (the trainers restart with
  it) are not sampled: their one-off start-up costs understate the capacities;
- hysteresis: reversing the previous direction needs `reversal_margin` more gain, at two looks
  in a row.

`decide` is a pure function of (policy, state, observation); the operator keeps the returned
state in the job's status and turns changed decisions into Events, the local runner into
process changes. Neighbours: `policy.types`, `policy.planner`, `policy.simulator` (drives it).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import TYPE_CHECKING

from plrl_operator.policy import planner, types

if TYPE_CHECKING:
    from plrl_api import spec as spec_mod

Action = types.ScaleAction
_ONE_TOKEN = planner.Lengths(1)  # placeholder lengths; only used with a lag limit, set from the job


@dataclasses.dataclass(frozen=True)
class Policy:
    """The autoscaler's settings: the spec's autoscale block plus the cluster's shape."""

    n_gpus: int
    every_steps: int = 10
    lower_ratio: float = 0.9
    upper_ratio: float = 0.95
    step_down: int = 5
    step_up: int = 2
    min_generators: int = 1
    max_generators: int | None = None
    cooldown_steps: int = 20
    warmup_steps: int = 0
    """Samples of this many steps after the start (or the last change, which restarts the trainers)
    are left out of the window: one-off start-up costs would understate the capacities."""
    gpus_per_generator: int = 1
    gpus_per_trainer: int = 1
    concurrency: int | None = None
    """H, for the g_max limit (None: no lag limit is applied)."""
    batch_size: int = 1
    lengths: planner.Lengths = _ONE_TOKEN
    max_lag: int | None = None
    reversal_margin: float = 0.02
    """Extra gain a move needs when it reverses the previous one."""
    min_gain: float = 0.01
    window_looks: int = 5
    """The rate estimate averages up to this many looks' worth of samples (every_steps each)."""
    rate_unit: str = "tok/s"
    """How the rates are measured, for messages: tokens/s on workers, tokens per flash simulated."""

    def allowed(self) -> list[int]:
        """Every I the autoscaler may choose, ascending."""
        ok = planner.allowed_generators(
            self.n_gpus,
            self.gpus_per_generator,
            self.gpus_per_trainer,
            self.min_generators,
            self.max_generators,
        )
        if self.concurrency is not None and self.max_lag is not None:
            cap = planner.lag_cap(self.concurrency, self.batch_size, self.lengths, self.max_lag)
            ok = ok[: bisect.bisect_right(ok, cap)]
        return ok


def policy_for_job(job: spec_mod.JobSpec) -> Policy:
    a, r = job.pipeline.autoscale, job.resources
    return Policy(
        n_gpus=r.total_gpus,
        every_steps=a.every_steps,
        lower_ratio=a.lower_ratio,
        upper_ratio=a.upper_ratio,
        step_down=a.step_down,
        step_up=a.step_up,
        min_generators=a.min_generators,
        max_generators=a.max_generators,
        cooldown_steps=a.cooldown_steps,
        warmup_steps=a.warmup_steps,
        gpus_per_generator=r.gpus_per_generator,
        gpus_per_trainer=r.gpus_per_trainer,
        concurrency=job.generation.concurrent_sequences,
        batch_size=job.training.batch_size,
        lengths=planner.Lengths(job.generation.max_new_tokens),
        max_lag=job.pipeline.max_lag,
    )


def _hold(
    obs: types.Observation, state: types.AutoscalerState, reason: str, ratio: float | None = None
) -> types.Decision:
    return types.Decision(Action.HOLD, obs.generators, obs.generators, obs.step, ratio, reason, state)


def _move(
    obs: types.Observation, state: types.AutoscalerState, target: int, reason: str, ratio: float | None
) -> types.Decision:
    action = Action.SCALE_UP if target > obs.generators else Action.SCALE_DOWN
    new_state = types.AutoscalerState(last_eval_step=obs.step, last_change_step=obs.step, last_action=action)
    verb = "Adding" if target > obs.generators else "Removing"
    text = f"{verb} generator GPUs {obs.generators} -> {target}: {reason}"
    return types.Decision(action, target, obs.generators, obs.step, ratio, text, new_state)


def _limits(p: Policy) -> str:
    hi = p.max_generators if p.max_generators is not None else p.n_gpus - p.gpus_per_trainer
    lag = f", g_max <= {p.max_lag} at H={p.concurrency}" if p.max_lag is not None and p.concurrency else ""
    return f"min {p.min_generators}, max {hi}, {p.gpus_per_generator} GPUs per generator{lag}"


def _window(p: Policy, state: types.AutoscalerState, obs: types.Observation) -> list[types.RateSample]:
    """Samples taken at the current I since the last change (and its warm-up), at most
    `window_looks` looks' worth.

    The longer I stays put, the more samples the estimate averages, so a steady job stops
    reacting to per-step noise; right after a change only fresh samples count.
    """
    # Steps count from 1; a job's start is treated like a change at step 0, warm-up included.
    since = (state.last_change_step if state.last_change_step is not None else 0) + p.warmup_steps
    fresh = [
        s
        for s in obs.samples
        if s.generators == obs.generators and since < s.step <= obs.step and s.gen_tokens_per_s >= 0
    ]
    fresh.sort(key=lambda s: s.step)
    return fresh[-p.every_steps * p.window_looks :]


@dataclasses.dataclass(frozen=True)
class _Capacities:
    """Per-accelerator capacities measured at the current I, extrapolated to any other I.

    Generators decode independently (each at its own batch H), so their rate is linear in I;
    trainers are assumed to scale linearly too, which the step bound keeps honest: every move is
    re-measured before the next one.
    """

    per_gen: float
    per_train: float
    n_gpus: int

    def throughput(self, a: int) -> float:
        return min(self.per_gen * a, self.per_train * (self.n_gpus - a))

    def ratio(self, a: int) -> float:
        gen_rate = self.per_gen * a
        # A rate so small it underflows means generators produce nothing: any trainer is idle.
        return 1.0 if gen_rate <= 0.0 else min(1.0, self.per_train * (self.n_gpus - a) / gen_rate)

    def gain(self, a: int, b: int) -> float:
        """Relative throughput change from I=a to I=b."""
        return self.throughput(b) / self.throughput(a) - 1


def decide(p: Policy, state: types.AutoscalerState, obs: types.Observation) -> types.Decision:
    """The I to run with after optimizer step `obs.step`, and why."""
    allowed = p.allowed()
    i = obs.generators
    if state.last_eval_step is not None and obs.step < state.last_eval_step:
        state = types.AutoscalerState()  # the step counter went backwards (a restarted run): start afresh
    if not allowed:
        return _hold(obs, state, f"no generator count satisfies the limits ({_limits(p)}); keeping I={i}")
    if i not in allowed:
        target = min(allowed, key=lambda a: (abs(a - i), a))
        return _move(obs, state, target, f"I={i} is outside the allowed range ({_limits(p)})", None)
    if state.last_eval_step is not None and obs.step - state.last_eval_step < p.every_steps:
        return _hold(obs, state, f"next look at step {state.last_eval_step + p.every_steps}")
    if state.last_change_step is not None and obs.step - state.last_change_step < p.cooldown_steps:
        return _hold(obs, state, f"cooling down after the change at step {state.last_change_step}")
    window = _window(p, state, obs)
    if len(window) < p.every_steps:
        return _hold(obs, state, f"waiting for rate samples at I={i} ({len(window)} of {p.every_steps})")
    gen = sum(s.gen_tokens_per_s for s in window) / len(window)
    train = sum(s.train_tokens_per_s for s in window) / len(window)
    evaluated = dataclasses.replace(state, last_eval_step=obs.step, pending=Action.HOLD)
    if gen <= 0:
        return _hold(obs, evaluated, "generators reported no throughput")
    if train <= 0:
        return _hold(obs, evaluated, "trainers reported no throughput")
    ratio = min(1.0, train / gen)
    cap = _Capacities(gen / i, train / (p.n_gpus - i), p.n_gpus)
    seed, reading = _seed_reading(p, ratio, gen, train, window)
    # The planner's optimum for the measured capacities (ties: the nearest, so equal I's never flap).
    best = max(allowed, key=lambda a: (cap.throughput(a), -abs(a - i)))
    toward = Action.HOLD if best == i else Action.SCALE_UP if best > i else Action.SCALE_DOWN
    reversal = state.last_action not in (Action.HOLD, toward)
    need = p.min_gain + (p.reversal_margin if reversal else 0.0)
    if toward is Action.HOLD or cap.gain(i, best) < need:
        return _hold(obs, evaluated, _why_hold(p, allowed, i, seed, reading, best, cap, need), ratio)
    if seed is toward:
        why = f"{reading}; toward the planner's optimum I={best} for the measured capacities"
    else:
        band = "hold" if seed is Action.HOLD else _verb(seed)
        why = (
            f"{reading}; the band would {band}, but the planner's optimum for the measured capacities "
            f"is I={best} ({cap.gain(i, best):+.1%} throughput): following the planner"
        )
    confirmed = state.pending is toward  # the previous look saw the same reversal
    return _step(p, evaluated, obs, allowed, toward, confirmed, cap, ratio, why)


_BOTTLENECK = {side: f"{side} are the bottleneck" for side in ("trainers", "generators")}


def _verb(action: Action) -> str:
    return "add generators" if action is Action.SCALE_UP else "remove generators"


def _seed_reading(
    p: Policy, ratio: float, gen: float, train: float, window: list[types.RateSample]
) -> tuple[Action, str]:
    """What the seed's band says (hold, add or remove generators) and a sentence saying why."""
    rates = f"generators {gen:.4g} {p.rate_unit}, trainers {train:.4g} {p.rate_unit}"
    where = f"ratio r_pipeline/r_gen = {ratio:.3f} over steps {window[0].step}-{window[-1].step}"
    if ratio < p.lower_ratio:
        return (
            Action.SCALE_DOWN,
            f"{where} is below {p.lower_ratio:.3f}: trainers are the bottleneck ({rates})",
        )
    if ratio <= p.upper_ratio:
        return Action.HOLD, f"{where} is within [{p.lower_ratio:.3f}, {p.upper_ratio:.3f}] ({rates})"
    if train >= gen:
        return (
            Action.SCALE_UP,
            f"{where} is above {p.upper_ratio:.3f}: generators are the bottleneck ({rates})",
        )
    # The seed's band keeps generation a few percent ahead of training: above the upper bound the
    # trainers are (still) the slower side, but the surplus that keeps them fed is too thin.
    return Action.SCALE_UP, (
        f"{where} is above {p.upper_ratio:.3f}: generation's surplus over training is only "
        f"{gen / train - 1:.1%} ({rates}); the band keeps generation at least "
        f"{1 / p.upper_ratio - 1:.1%} ahead"
    )


def _why_hold(
    p: Policy,
    allowed: list[int],
    i: int,
    seed: Action,
    reading: str,
    best: int,
    cap: _Capacities,
    need: float,
) -> str:
    if seed is Action.HOLD and best == i:
        return reading
    at_limit = (i == allowed[-1]) if seed is Action.SCALE_UP else (i == allowed[0])
    if seed is not Action.HOLD and at_limit:
        bound = "upper" if seed is Action.SCALE_UP else "lower"
        return f"{reading}; already at the {bound} limit ({_limits(p)})"
    if best == i:
        return (
            f"{reading}; but I={i} is already the planner's optimum for the measured capacities "
            f"({cap.throughput(i):.4g} {p.rate_unit}): holding"
        )
    return (
        f"{reading}; but the planner's optimum for the measured capacities, I={best}, gains only "
        f"{cap.gain(i, best):+.1%} throughput (a move needs {need:.0%}"
        f"{', as it would reverse the last change' if need > p.min_gain else ''}): holding"
    )


def _not_worth_it(p: Policy, obs: types.Observation, gain: float) -> str:
    """The cost/benefit gate: a change pauses training for about `rescale_cost_s` (the last change's
    measured cost), so over the next decision period it must win back more than it loses:
    gain x (period - cost) >= cost, with period = max(everySteps, cooldownSteps) steps. Empty: take it."""
    cost, per_step = obs.rescale_cost_s, obs.step_seconds
    if cost is None or per_step is None or cost <= 0 or per_step <= 0:
        return ""  # nothing measured yet: the first change is taken on the capacities alone
    period = max(p.every_steps, p.cooldown_steps) * per_step
    if gain * (period - cost) >= cost:
        return ""
    unit = "flashes" if p.rate_unit.endswith("flash") else "s"
    return (
        f"{gain:+.1%} throughput over the next decision period ({period:.4g} {unit}) does not win back "
        f"the {cost:.4g} {unit} the last change of I cost"
    )


def _step(
    p: Policy,
    state: types.AutoscalerState,
    obs: types.Observation,
    allowed: list[int],
    toward: Action,
    confirmed: bool,
    cap: _Capacities,
    ratio: float,
    why: str,
) -> types.Decision:
    """One bounded step toward the optimum: at most stepUp/stepDown GPUs, or one whole pod."""
    i = obs.generators
    down = toward is Action.SCALE_DOWN
    k = allowed.index(i)
    side = allowed[:k][::-1] if down else allowed[k + 1 :]  # nearest first
    size = p.step_down if down else p.step_up
    reach = [a for a in side if abs(a - i) <= size]
    if not reach:  # the configured step is smaller than one whole pod (or pair of pods)
        reach = side[:1]
        why += f"; the smallest whole-pod step is {abs(reach[0] - i)} GPUs"
    # Within reach, the best I; never past the optimum (that would only make the next look reverse).
    target = max(reach, key=lambda a: (cap.throughput(a), -abs(a - i)))
    gain = cap.gain(i, target)
    if gain <= 0:  # only where rates are so extreme that throughput rounds flat
        return _hold(obs, state, f"{why}; holding: the reachable step (to I={target}) gains nothing", ratio)
    not_worth = _not_worth_it(p, obs, gain)
    if not_worth:
        return _hold(obs, state, f"{why}; holding: {not_worth}", ratio)
    reversal = state.last_action not in (Action.HOLD, toward)
    if reversal and not confirmed:
        # Undoing the previous change on one reading is how noise makes a controller flap.
        pending = dataclasses.replace(state, pending=toward)
        return _hold(
            obs, pending, f"{why}; reversing the last change waits for the next look to agree", ratio
        )
    return _move(
        obs, state, target, f"{why}; predicted ratio {cap.ratio(target):.3f}, {gain:+.1%} throughput", ratio
    )
