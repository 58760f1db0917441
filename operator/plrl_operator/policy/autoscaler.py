"""When to change I (generator accelerators) while a job runs: the seed's tuning rule, made safe.

Every `everySteps` optimizer steps the autoscaler looks at ratio = r_pipeline / r_gen from the
measured generator and trainer capacities. Below `lowerRatio` the trainers are the bottleneck
and I drops by `stepDown`; above `upperRatio` the generators are and I grows by `stepUp`; in
between (a 5-10% generation surplus that keeps the trainers fed) it holds. Around that rule:

- hard limits: whole generator and trainer pods, min/max generators and the model's g_max
  limit (`planner.lag_cap`) are never crossed; a current I outside them is moved inside at once;
- cool-down: no change within `cooldownSteps` of the last one, and only samples taken after it
  (at the current I) count; the longer I stays put, the more of them the estimate averages;
- no overshoot: per-accelerator rates predict the ratio after a move, and the step is shortened
  so that it lands inside the band by `reversal_margin`; when even one pod would jump across,
  it moves only if the predicted throughput gains at least `min_gain`;
- hysteresis: reversing the previous direction needs the ratio `reversal_margin` further out,
  at two looks in a row.

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
    gpus_per_generator: int = 1
    gpus_per_trainer: int = 1
    concurrency: int | None = None
    """H, for the g_max limit (None: no lag limit is applied)."""
    batch_size: int = 1
    lengths: planner.Lengths = _ONE_TOKEN
    max_lag: int | None = None
    reversal_margin: float = 0.02
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
    """Samples taken at the current I since the last change, at most `window_looks` looks' worth.

    The longer I stays put, the more samples the estimate averages, so a steady job stops
    reacting to per-step noise; right after a change only fresh samples count.
    """
    since = state.last_change_step if state.last_change_step is not None else -1
    fresh = [
        s
        for s in obs.samples
        if s.generators == obs.generators and since < s.step <= obs.step and s.gen_tokens_per_s >= 0
    ]
    fresh.sort(key=lambda s: s.step)
    return fresh[-p.every_steps * p.window_looks :]


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
    need = p.every_steps
    if len(window) < need:
        return _hold(obs, state, f"waiting for rate samples at I={i} ({len(window)} of {need})")
    gen = sum(s.gen_tokens_per_s for s in window) / len(window)
    train = sum(s.train_tokens_per_s for s in window) / len(window)
    evaluated = dataclasses.replace(state, last_eval_step=obs.step, pending=Action.HOLD)
    if gen <= 0:
        return _hold(obs, evaluated, "generators reported no throughput")
    ratio = min(1.0, train / gen)
    lower = p.lower_ratio - (p.reversal_margin if state.last_action is Action.SCALE_UP else 0.0)
    upper = p.upper_ratio + (p.reversal_margin if state.last_action is Action.SCALE_DOWN else 0.0)
    upper = min(upper, 0.999)
    rates = f"generators {gen:.4g} {p.rate_unit}, trainers {train:.4g} {p.rate_unit}"
    where = f"ratio r_pipeline/r_gen = {ratio:.3f} over steps {window[0].step}-{window[-1].step}"
    if lower <= ratio <= upper:
        return _hold(obs, evaluated, f"{where} is within [{lower:.3f}, {upper:.3f}]", ratio)
    down = ratio < lower
    if down:
        why = f"{where} is below {lower:.3f}: trainers are the bottleneck ({rates})"
    elif train >= gen:
        why = f"{where} is above {upper:.3f}: generators are the bottleneck ({rates})"
    else:
        # The seed's band keeps generation a few percent ahead of training: above the upper bound the
        # trainers are (still) the slower side, but the surplus that keeps them fed is too thin.
        why = (
            f"{where} is above {upper:.3f}: generation's surplus over training is only "
            f"{gen / train - 1:.1%} ({rates}); the band keeps generation at least "
            f"{1 / upper - 1:.1%} ahead"
        )
    wanted = Action.SCALE_DOWN if down else Action.SCALE_UP
    reversal = state.last_action not in (Action.HOLD, wanted)
    if reversal and state.pending is not wanted:
        # Undoing the previous change on one reading is how noise makes a controller flap.
        pending = dataclasses.replace(evaluated, pending=wanted)
        return _hold(
            obs, pending, f"{why}; reversing the last change waits for the next look to agree", ratio
        )
    return _step(p, evaluated, obs, allowed, down, gen / i, train / (p.n_gpus - i), ratio, why)


def _step(
    p: Policy,
    state: types.AutoscalerState,
    obs: types.Observation,
    allowed: list[int],
    down: bool,
    per_gen: float,
    per_train: float,
    ratio: float,
    why: str,
) -> types.Decision:
    i, n = obs.generators, p.n_gpus

    def predicted_ratio(a: int) -> float:
        gen_rate = per_gen * a
        # A rate so small it underflows means generators produce nothing: any trainer is idle.
        return 1.0 if gen_rate <= 0.0 else min(1.0, per_train * (n - a) / gen_rate)

    def throughput(a: int) -> float:
        return min(per_gen * a, per_train * (n - a))

    k = allowed.index(i)
    side = allowed[:k][::-1] if down else allowed[k + 1 :]  # nearest first
    if not side:
        bound = "lower" if down else "upper"
        return _hold(obs, state, f"{why}; already at the {bound} limit ({_limits(p)})", ratio)
    size = p.step_down if down else p.step_up
    reach = [a for a in side if abs(a - i) <= size]
    if not reach:  # the configured step is smaller than one whole pod (or pair of pods)
        reach = side[:1]
        why += f"; the smallest whole-pod step is {abs(reach[0] - i)} GPUs"
    for a in reversed(reach):  # farthest first
        pr = predicted_ratio(a)
        # Land inside the band with the same margin a reversal needs, so noise cannot bounce it back.
        if (pr <= p.upper_ratio - p.reversal_margin) if down else (pr >= p.lower_ratio + p.reversal_margin):
            return _move(obs, state, a, f"{why}; predicted ratio {pr:.3f}", ratio)
    a = reach[0]
    gain = throughput(a) / throughput(i) - 1
    if gain >= p.min_gain:
        return _move(
            obs,
            state,
            a,
            f"{why}; the smallest step overshoots the band but gains {gain:.1%} throughput",
            ratio,
        )
    return _hold(
        obs,
        state,
        f"{why}; holding: the smallest step (to I={a}) would overshoot the band "
        f"(predicted ratio {predicted_ratio(a):.3f}) for {gain:+.1%} throughput",
        ratio,
    )
