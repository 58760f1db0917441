"""The discrete-event simulation agrees with the closed forms where their assumptions hold."""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib

import pytest

from plrl_api import utilisation
from plrl_operator import simulate_cli
from plrl_operator.policy import autoscaler, planner, simulator, types

H100 = utilisation.builtin("h100")
TAU = planner.PAPER_TAU


def _cfg(**overrides: object) -> simulator.SimConfig:
    base: dict[str, object] = {
        "n_gpus": 128,
        "batch_size": 128,
        "lengths": planner.Lengths(1024),
        "curve": H100,
        "tau": TAU,
        "steps": 400,
    }
    base.update(overrides)
    return simulator.SimConfig(**base)  # type: ignore[arg-type]


def _within(value: float, expected: float, rel: float = 0.10) -> bool:
    return abs(value - expected) <= rel * expected


def test_speedup_at_n128_matches_the_paper() -> None:
    cfg = _cfg()
    conv = simulator.simulate_conventional(dataclasses.replace(cfg, steps=256), steps_per_round=128)
    pipe = simulator.simulate_pipeline(cfg, generators=44, concurrency=192)
    assert _within(pipe.throughput / conv.throughput, 1.57)


def test_conventional_matches_the_closed_form() -> None:
    for n, g in ((128, 128), (32, 16)):
        cfg = _cfg(n_gpus=n, steps=2 * g)
        sim = simulator.simulate_conventional(cfg, steps_per_round=g)
        model = planner.conventional_rates(n, 128, g, cfg.lengths, TAU, H100)
        assert _within(sim.throughput, model.r_conv), (n, sim.throughput, model.r_conv)
        assert sim.max_lag == g - 1


def test_generation_bound_pipeline_matches_the_closed_form() -> None:
    cfg = _cfg(n_gpus=32, batch_size=64, steps=300)
    sim = simulator.simulate_pipeline(cfg, generators=6, concurrency=64)
    model = planner.pipeline_rates(32, 6, 64, 64, cfg.lengths, TAU, H100)
    assert model.bottleneck == "generation"
    assert _within(sim.throughput, model.r_pipeline)
    assert _within(sim.max_lag, model.lag_steps, 0.15)


def test_training_bound_pipeline_matches_the_closed_form() -> None:
    cfg = _cfg(n_gpus=32, batch_size=64, steps=300)
    sim = simulator.simulate_pipeline(cfg, generators=20, concurrency=64)
    model = planner.pipeline_rates(32, 20, 64, 64, cfg.lengths, TAU, H100)
    assert model.bottleneck == "training"
    assert _within(sim.throughput, model.r_pipeline)


def test_weight_broadcasts_cost_throughput() -> None:
    cfg = _cfg(n_gpus=32, batch_size=64, steps=200)
    free = simulator.simulate_pipeline(cfg, generators=10, concurrency=64)
    step_flashes = 64 * cfg.lengths.mean / free.throughput
    slow = simulator.simulate_pipeline(
        dataclasses.replace(cfg, broadcast_flashes=0.5 * step_flashes), generators=10, concurrency=64
    )
    assert slow.throughput < 0.8 * free.throughput


def test_runs_are_reproducible_from_the_seed() -> None:
    cfg = _cfg(n_gpus=16, batch_size=32, steps=60)
    a = simulator.simulate_pipeline(cfg, 5, 32)
    b = simulator.simulate_pipeline(cfg, 5, 32)
    c = simulator.simulate_pipeline(dataclasses.replace(cfg, seed=1), 5, 32)
    assert a.records == b.records
    assert a.records != c.records


def test_autoscaled_run_recovers_from_a_bad_start() -> None:
    cfg = _cfg(steps=500, rate_noise=0.05)
    policy = autoscaler.Policy(n_gpus=128)
    run = simulator.simulate_pipeline(cfg, generators=80, concurrency=192, policy=policy)
    assert run.lost_tokens > 0  # removed generators drop their in-flight sequences
    best = planner.plan(planner.Workload(128, 128, cfg.lengths, tau=TAU), H100).pipeline.r_pipeline
    assert run.throughput > 0.95 * best


def _reversals(decisions: tuple[types.Decision, ...]) -> int:
    return sum(a.action is not b.action for a, b in itertools.pairwise(decisions))


@pytest.mark.parametrize(
    ("n", "start"),
    [(64, 4), (64, 50), (128, 8), (128, 110)],
)
def test_closed_loop_converges_to_the_planners_optimum_without_flapping(n: int, start: int) -> None:
    plan = planner.plan(planner.Workload(n, 128, planner.Lengths(1024), tau=TAU), H100).pipeline
    cfg = _cfg(n_gpus=n, steps=800, rate_noise=0.05)
    # A lag limit just above the optimum's g_max: never binding there, checked on the way.
    max_lag = plan.g_max + 10
    policy = autoscaler.Policy(
        n_gpus=n, concurrency=plan.concurrency, batch_size=128, lengths=cfg.lengths, max_lag=max_lag
    )
    run = simulator.simulate_pipeline(cfg, generators=start, concurrency=plan.concurrency, policy=policy)
    assert abs(run.generators[-1] - plan.generators) <= 1, [(d.step, d.generators) for d in run.decisions]
    steps_needed = math.ceil(abs(start - plan.generators) / min(policy.step_up, policy.step_down))
    assert len(run.decisions) <= steps_needed + 2  # bounded: about one decision per step of the way
    assert _reversals(run.decisions) <= 1
    # A start past the lag limit is moved inside at the first step; every I after that respects it.
    assert all(planner.g_max(plan.concurrency, i, 128, cfg.lengths) <= max_lag for i in run.generators[1:])
    # Converged within the first half and stayed within one GPU of the optimum afterwards.
    assert all(abs(i - plan.generators) <= 1 for i in run.generators[len(run.generators) // 2 :])


def test_closed_loop_under_a_binding_lag_limit_stops_at_the_limit() -> None:
    # g_max <= 100 steps at H=192, B=128, L=1024 allows I <= 33, below the unconstrained optimum (44).
    cfg = _cfg(steps=400, rate_noise=0.05)
    policy = autoscaler.Policy(n_gpus=128, concurrency=192, batch_size=128, lengths=cfg.lengths, max_lag=100)
    cap = policy.allowed()[-1]
    assert cap == 33
    run = simulator.simulate_pipeline(cfg, generators=8, concurrency=192, policy=policy)
    assert max(run.generators) == cap == run.generators[-1]
    assert run.max_lag <= 100 * 1.1  # the model's bound; sampled lengths may run a few steps over


def test_simulate_cli_writes_table_and_plot(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "sim.png"
    argv = ["-N", "8,16", "-R", "4", "--steps", "40", "--autoscale-steps", "60", "--png", str(png)]
    assert simulate_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "autoscaled pipeline at N=16" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_cli_writes_its_plot_under_runs_by_default(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # a checkout: nothing may land beside the user's files
    assert simulate_cli.main(["-N", "8", "--steps", "20", "--autoscale-steps", "20"]) == 0
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()] == [
        pathlib.Path("runs/plrl-simulate.png")
    ]
    assert "plot written to runs/plrl-simulate.png" in capsys.readouterr().out


def test_simulate_cli_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_cli.main(["-N", "8,0", "--png", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GPU counts must be positive" in err


def test_when_a_change_costs_more_than_it_can_win_back_the_autoscaler_stops_changing() -> None:
    # Each change pauses the run for 30% of a decision period (20 steps): after the first change has
    # shown that cost, a step must gain over 43% to pay for itself, and +25% (8 -> 10) does not.
    cfg = _cfg(steps=200)
    per_step = simulator.simulate_pipeline(cfg, generators=8, concurrency=192).records[-1].time / 200
    policy = autoscaler.Policy(n_gpus=128)
    free = simulator.simulate_pipeline(cfg, generators=8, concurrency=192, policy=policy)
    costly_cfg = dataclasses.replace(cfg, rescale_flashes=0.3 * 20 * per_step)
    costly = simulator.simulate_pipeline(costly_cfg, generators=8, concurrency=192, policy=policy)
    assert len(free.decisions) > 3
    assert len(costly.decisions) == 1
