"""The throughput model reproduces the paper's worked example and respects every limit it is given."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plrl_api import spec, utilisation
from plrl_operator.policy import planner

H100 = utilisation.builtin("h100")


def _paper(**overrides: object) -> planner.Workload:
    base: dict[str, object] = {
        "n_gpus": 128,
        "batch_size": 128,
        "lengths": planner.Lengths(1024),
        "steps_per_round": 128,
        "tau": H100.tau,
    }
    base.update(overrides)
    return planner.Workload(**base)  # type: ignore[arg-type]


def _close(value: float, expected: float, rel: float = 0.05) -> bool:
    return abs(value - expected) <= rel * abs(expected)


def test_paper_worked_example() -> None:
    p = planner.plan(_paper(), H100)
    c, q = p.conventional, p.pipeline
    assert _close(c.r_gen, 18.3) and _close(c.r_train, 26.02) and _close(c.r_conv, 10.7)
    assert abs(q.generators - 44) <= 2
    assert _close(q.concurrency, 192)
    assert _close(q.r_gen, 16.9) and _close(q.r_train, 17.08) and _close(q.r_pipeline, 16.9)
    assert _close(p.speedup, 1.57)
    assert _close(q.g_max, 133)
    assert q.bottleneck == "generation"


def test_lag_at_b2048_with_the_same_per_gpu_load() -> None:
    p = planner.plan(_paper(batch_size=2048, steps_per_round=8), H100)
    assert (p.pipeline.generators, p.pipeline.concurrency) == (44, 192)  # rates do not depend on B
    assert _close(p.pipeline.lag_steps, 8.0)  # the paper's "about 8" (unrounded 8.24)
    assert p.pipeline.g_max == math.ceil(p.pipeline.lag_steps)


def test_conventional_rate_does_not_depend_on_l_for_long_sequences() -> None:
    short = planner.plan(_paper(lengths=planner.Lengths(512)), H100).conventional.r_gen
    long = planner.plan(_paper(lengths=planner.Lengths(8192)), H100).conventional.r_gen
    assert _close(short, long, 0.01)


def test_conventional_stops_scaling_with_n_while_pipeline_keeps_going() -> None:
    small = planner.plan(_paper(n_gpus=128), H100)
    big = planner.plan(_paper(n_gpus=1024), H100)
    assert big.conventional.r_gen / small.conventional.r_gen < 2  # 8x the GPUs, < 2x the rate
    assert big.pipeline.r_pipeline / small.pipeline.r_pipeline > 7


def test_lag_limit_is_respected_at_some_cost() -> None:
    free = planner.plan(_paper(), H100)
    limited = planner.plan(_paper(max_lag=16), H100)
    assert limited.pipeline.g_max <= 16
    assert limited.pipeline.r_pipeline < free.pipeline.r_pipeline


def test_unsatisfiable_lag_limit_is_a_plan_error() -> None:
    with pytest.raises(planner.PlanError, match="max lag 2"):
        planner.plan(_paper(max_lag=2, concurrency=192), H100)


def test_fixed_lengths_double_the_lag_of_uniform_ones_per_token() -> None:
    uniform = planner.plan(_paper(generators=44, concurrency=192), H100).pipeline
    fixed = planner.plan(_paper(generators=44, concurrency=192, lengths=planner.Lengths(1024, "fixed")), H100)
    assert fixed.pipeline.lag_steps == pytest.approx(44 * 192 / 128)
    assert uniform.lag_steps == pytest.approx(2 * 44 * 192 / 128, rel=0.01)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_gpus": 0}, "N=0 must be positive"),
        ({"n_gpus": -4}, "N=-4 must be positive"),
        ({"generators": 128}, "I=128 must be less than the total GPUs N=128"),
        ({"generators": 6, "gpus_per_generator": 4}, "multiple of GPUs per generator=4"),
        ({"batch_size": 0}, "B=0"),
        ({"tau": 0.0}, "tau=0.0"),
    ],
)
def test_bad_workloads_name_the_input(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(planner.PlanError, match=message):
        _paper(**overrides)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 512),
    gpg=st.sampled_from([1, 2, 4, 8]),
    gpt=st.sampled_from([1, 2, 4, 8]),
    b=st.integers(1, 4096),
    max_lag=st.one_of(st.none(), st.integers(0, 200)),
    h=st.one_of(st.none(), st.integers(1, 1024)),
)
def test_plans_never_break_pods_or_lag(
    n: int, gpg: int, gpt: int, b: int, max_lag: int | None, h: int | None
) -> None:
    try:
        w = _paper(
            n_gpus=n,
            gpus_per_generator=gpg,
            gpus_per_trainer=gpt,
            batch_size=b,
            max_lag=max_lag,
            concurrency=h,
        )
        p = planner.plan(w, H100)
    except planner.PlanError:
        return  # e.g. N too small for one pod of each, or the lag limit admits nothing
    i = p.pipeline.generators
    assert 0 < i < n and i % gpg == 0 and (n - i) % gpt == 0
    assert max_lag is None or p.pipeline.g_max <= max_lag
    assert h is None or p.pipeline.concurrency == h
    assert p.pipeline.r_pipeline == min(p.pipeline.r_gen, p.pipeline.r_train)


def _job(**spec_overrides: object) -> spec.JobSpec:
    doc = {"apiVersion": "pipelinerl.io/v1alpha1", "kind": "PipelineRLJob", "metadata": {"name": "j"}}
    return spec.parse_job({**doc, "spec": {"model": {"name": "/models/demo"}, **spec_overrides}}).spec


def test_initial_generators_seed_rule_without_curve() -> None:
    big = {"maxLag": 10_000}
    assert planner.initial_generators(_job(resources={"totalGPUs": 8})) == 2
    assert planner.initial_generators(_job(resources={"totalGPUs": 300}, pipeline=big)) == 64
    assert planner.initial_generators(_job(resources={"totalGPUs": 60}, pipeline=big)) == 20
    # whole pods: generators of 4 GPUs, trainers of 8
    job = _job(resources={"totalGPUs": 64, "gpusPerGenerator": 4, "gpusPerTrainer": 8}, pipeline=big)
    i = planner.initial_generators(job)
    assert i % 4 == 0 and (64 - i) % 8 == 0 and i <= 64 // 3


def test_initial_generators_spec_value_wins() -> None:
    assert planner.initial_generators(_job(resources={"totalGPUs": 16}, pipeline={"generators": 5})) == 5


def test_initial_generators_uses_the_planner_when_a_curve_is_known() -> None:
    job = _job(
        resources={"totalGPUs": 128},
        generation={"concurrentSequences": 192, "maxNewTokens": 1024},
        training={"batchSize": 128},
        pipeline={"maxLag": 1000},
    )
    assert planner.initial_generators(job, H100) == 44
    assert planner.initial_generators(job) == 42  # the seed's min(N // 3, 64)


def test_initial_generators_respects_the_lag_limit_when_it_can() -> None:
    # H=64, B=128, L/Lbar ~ 2: g_max <= 8 allows at most I = 8
    job = _job(resources={"totalGPUs": 64}, pipeline={"maxLag": 8})
    assert planner.initial_generators(job) == 8
    assert planner.initial_generators(job, H100) <= 8


def test_curve_interpolates_and_saturates() -> None:
    c = utilisation.from_points("t", [(10, 0.1), (20, 0.3), (40, 0.5)])
    assert c.u(5) == pytest.approx(0.05)  # proportional to h below the first point
    assert c.u(15) == pytest.approx(0.2)
    assert c.u(1000) == 0.5


@pytest.mark.parametrize(
    ("points", "message"),
    [
        (
            [[10, 0.3], [20, 0.2]],
            r"points\[1\]: U must not decrease as h grows, but U\(20\)=0.2 < U\(10\)=0.3",
        ),
        ([[10, 0.3], [20, 1.2]], r"points\[1\]: U=1.2 at h=20 must be in \(0, 1\]"),
        ([[10, 0.0]], r"points\[0\]: U=0.0"),
        ([[0, 0.1]], r"points\[0\]: h=0.0 must be positive"),
        ([[10, 0.1], [10, 0.2]], r"points\[1\]: h must increase"),
        ([], r"points: List should have at least 1 item"),
    ],
)
def test_bad_curves_name_the_point(tmp_path: pathlib.Path, points: list[list[float]], message: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "bad", "points": points}))
    with pytest.raises(utilisation.CurveError, match=message):
        utilisation.load(path)


def test_curve_round_trips_through_json(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "h.json"
    path.write_text(H100.to_json())
    again = utilisation.load(path)
    assert again.hs == H100.hs and again.us == H100.us and again.tau == H100.tau
