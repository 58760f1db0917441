"""The delay-compensated step (DC-ASGD, `training.delayCompensation`): the formula element by element,
the bounded weight history, the batch's behaviour version, and the torch backend applying it to the
reduced gradients of a real step of the tiny model (seen by an optimizer pre-step hook)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from plrl_workers.engines import ddp_engine, training
from plrl_workers.models import tiny
from plrl_workers.rl import delay_compensation as dc


def test_compensate_is_g_plus_lambda_g_squared_times_the_weight_change() -> None:
    g, now, old = [0.5, -2.0, 0.0, 3.0], [1.0, 1.0, 5.0, -1.0], [0.0, 1.5, 2.0, -1.0]
    lam = 0.25
    got = dc.compensate(torch.tensor(g), torch.tensor(now), torch.tensor(old), lam)
    expected = [gi + lam * gi * gi * (n - o) for gi, n, o in zip(g, now, old, strict=True)]
    assert got.tolist() == pytest.approx(expected)
    # lambda 0, or no weight change, leaves the gradient as it is.
    assert dc.compensate(torch.tensor(g), torch.tensor(now), torch.tensor(old), 0.0).tolist() == g
    assert dc.compensate(torch.tensor(g), torch.tensor(now), torch.tensor(now), 9.0).tolist() == g


def test_the_behaviour_version_is_the_rounded_mean_token_version() -> None:
    assert dc.behaviour_version(version_sum=3 * 4 + 1 * 5, tokens=4, trainer_version=6) == 4  # 4.25
    assert dc.behaviour_version(version_sum=2 * 4 + 2 * 5 + 1, tokens=4, trainer_version=6) == 5  # 4.75
    assert dc.behaviour_version(version_sum=0.0, tokens=0.0, trainer_version=6) == 6  # no tokens: no lag


def test_the_history_keeps_max_lag_plus_one_versions_and_falls_back_to_the_nearest_older() -> None:
    h = dc.WeightHistory(keep=3)
    for v in range(5):
        h.record(v, [torch.full((2,), float(v))])
    assert h.versions == [2, 3, 4]
    found, weights = h.weights(3)
    assert found == 3 and weights[0].tolist() == [3.0, 3.0]
    assert h.weights(1)[0] == 2  # evicted: the oldest held stands in
    assert h.weights(7)[0] == 4  # newer than any held: the newest older one
    p = torch.zeros(2)
    h.record(5, [p])
    p.add_(1.0)  # a copy: later updates of the live parameter do not reach the history
    assert h.weights(5)[1][0].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="at least one"):
        dc.WeightHistory(0)


@pytest.fixture
def group_of_one() -> Iterator[None]:
    joined = not dist.is_initialized()
    training.init_distributed(None)
    yield
    if joined:
        dist.destroy_process_group()


def _engine(model_dir: pathlib.Path, lam: float) -> tuple[ddp_engine.DDPEngine, list[list[torch.Tensor]]]:
    """A one-rank torch engine without clipping, and the gradients each optimizer step is given."""
    cfg = training.TrainEngineConfig(
        model_path=str(model_dir),
        gradient_clipping=0.0,
        learning_rate=1e-2,
        delay_compensation=lam,
        max_lag=2,
    )
    engine = ddp_engine.DDPEngine(cfg)
    seen: list[list[torch.Tensor]] = []
    engine._opt.register_step_pre_hook(
        lambda opt, *_: seen.append([p.grad.clone() for g in opt.param_groups for p in g["params"]])
    )
    return engine, seen


def _step(engine: ddp_engine.DDPEngine, behaviour_version: int) -> dict[str, float]:
    ids = torch.tensor([[5, 9, 13, 2, 7, 11]])

    def loss(module: torch.nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        return module(input_ids=ids, use_cache=False).logits.float().square().mean(), {}

    engine.train_micro_batch(loss, last=True)
    return engine.step(behaviour_version)


@pytest.mark.usefixtures("group_of_one")
def test_the_torch_backend_compensates_the_gradient_for_the_batchs_lag(tmp_path: pathlib.Path) -> None:
    model_dir = tiny.build(tmp_path / "tiny")
    plain, plain_grads = _engine(model_dir, 0.0)
    comp, comp_grads = _engine(model_dir, 0.5)
    w0 = [p.detach().clone() for p in comp._model.parameters()]
    for engine in (plain, comp):
        _step(engine, behaviour_version=0)  # on-policy: nothing to compensate
    torch.testing.assert_close(comp_grads[0], plain_grads[0])
    w1 = [p.detach().clone() for p in comp._model.parameters()]
    _step(plain, behaviour_version=0)
    got = _step(comp, behaviour_version=0)  # sampled by version 0, trained at version 1
    expected = [dc.compensate(g, now, old, 0.5) for g, now, old in zip(plain_grads[1], w1, w0, strict=True)]
    torch.testing.assert_close(comp_grads[1], expected)
    assert any(not torch.equal(a, b) for a, b in zip(comp_grads[1], plain_grads[1], strict=True))
    assert (got["dc_lag"], got["dc_version_miss"]) == (1.0, 0.0)
