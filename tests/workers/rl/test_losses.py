"""The loss registry: truncated-IS REINFORCE reduces to REINFORCE with baseline on-policy, truncation
engages exactly where pi/pi_behaviour exceeds the clamp, the per-token normalisation across the
optimizer batch, ESS and clamp metrics, finite gradients under extreme ratios, and rl_step on the
tiny model (on-policy behaviour logprobs -> all IS weights 1)."""

from __future__ import annotations

import math
import pathlib
import random

import pytest
import torch

from plrl_workers.models import tiny
from plrl_workers.rl import losses, packing, step


def _inputs(
    logprobs: list[float],
    behaviour: list[float],
    adv: list[float],
    mask: list[bool] | None = None,
    weights: list[float] | None = None,
    normalizer: float | None = None,
) -> tuple[losses.LossInputs, torch.Tensor]:
    lp = torch.tensor(logprobs, requires_grad=True)
    m = torch.tensor(mask if mask is not None else [True] * len(logprobs))
    x = losses.LossInputs(
        logprobs=lp,
        behaviour_logprobs=torch.tensor(behaviour),
        advantages=torch.tensor(adv),
        weights=torch.tensor(weights if weights is not None else [1.0] * len(logprobs)),
        loss_mask=m,
        normalizer=normalizer if normalizer is not None else float(m.sum()),
    )
    return x, lp


def _grad(loss: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, lp)
    return g


def test_on_policy_truncated_is_equals_reinforce_with_baseline() -> None:
    lp_vals = [-0.3, -2.0, -1.1, -0.05, -4.0]
    adv = [0.5, 0.5, -1.0, -1.0, 2.0]
    x, lp = _inputs(lp_vals, lp_vals, adv)
    cfg = losses.LossConfig("reinforce_tis", is_clamp=5.0)
    loss_tis, sums = losses.get("reinforce_tis")(x, cfg)
    y, lp2 = _inputs(lp_vals, lp_vals, adv)
    loss_pg, _ = losses.get("reinforce")(y, cfg)
    expected = -sum(a * v for a, v in zip(adv, lp_vals, strict=True)) / len(lp_vals)
    assert float(loss_tis.detach()) == pytest.approx(expected, abs=1e-6)
    assert float(loss_pg.detach()) == pytest.approx(expected, abs=1e-6)
    torch.testing.assert_close(_grad(loss_tis, lp), _grad(loss_pg, lp2))
    torch.testing.assert_close(_grad(losses.get("reinforce_tis")(x, cfg)[0], lp), -torch.tensor(adv) / 5)
    m = losses.summarize(sums)
    assert m["ess"] == pytest.approx(1.0) and m["is_weight_mean"] == pytest.approx(1.0)
    assert m["clamp_frac"] == 0.0 and m["kl"] == pytest.approx(0.0, abs=1e-7)


def test_truncation_engages_exactly_where_the_ratio_exceeds_the_clamp() -> None:
    ratios = [0.5, 4.9, 5.0, 5.1, 20.0, 1e30]
    behaviour = [-3.0] * len(ratios)
    lp_vals = [b + math.log(r) for b, r in zip(behaviour, ratios, strict=True)]
    adv = [1.0, -1.0, 1.0, 1.0, -1.0, 1.0]
    x, lp = _inputs(lp_vals, behaviour, adv, weights=[1, 1, 1, 1, 1, 0.5])
    loss, sums = losses.reinforce_tis(x, losses.LossConfig(is_clamp=5.0))
    _, truncated, clamped = losses.importance_weights(x, 5.0)
    assert clamped.tolist() == [False, False, False, True, True, True]
    torch.testing.assert_close(truncated, torch.tensor([0.5, 4.9, 5.0, 5.0, 5.0, 5.0]), rtol=1e-5, atol=1e-6)
    # d loss / d logprob_t = -c_t * weight_t * A_t / N with c_t the truncated weight, held constant.
    g = _grad(loss, lp)
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g, -truncated * torch.tensor([1, 1, 1, 1, 1, 0.5]) * torch.tensor(adv) / 6)
    assert sums["clamped_tokens"] == 3
    assert losses.summarize(sums)["clamp_frac"] == pytest.approx(0.5)


def test_plain_reinforce_ignores_the_ratio_but_reports_it() -> None:
    x, lp = _inputs([-1.0, -1.0], [-5.0, -1.0], [1.0, 1.0])
    loss, sums = losses.reinforce(x, losses.LossConfig(is_clamp=5.0))
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([-0.5, -0.5]))
    assert losses.summarize(sums)["clamp_frac"] == pytest.approx(0.5)


def test_normalisation_is_per_token_across_the_optimizer_batch() -> None:
    """Micro-batch losses with the batch's token count add up to the batch loss; tokens weigh equally."""
    lp_vals = [-0.5, -1.5, -0.7, -2.2, -0.1]
    adv = [1.0, 1.0, 1.0, -0.5, -0.5]  # a 3-token sample and a 2-token sample
    cfg = losses.LossConfig()
    whole, _ = losses.reinforce_tis(_inputs(lp_vals, lp_vals, adv)[0], cfg)
    first, _ = losses.reinforce_tis(_inputs(lp_vals[:3], lp_vals[:3], adv[:3], normalizer=5)[0], cfg)
    second, _ = losses.reinforce_tis(_inputs(lp_vals[3:], lp_vals[3:], adv[3:], normalizer=5)[0], cfg)
    assert float((first + second).detach()) == pytest.approx(float(whole.detach()), abs=1e-7)
    assert float(whole.detach()) == pytest.approx(-sum(a * v for a, v in zip(adv, lp_vals, strict=True)) / 5)


def test_masked_tokens_and_sample_weights() -> None:
    # A masked token with an absurd ratio changes nothing; a half-weight sample counts half.
    x, lp = _inputs([-1.0, 50.0, -1.0], [-1.0, -90.0, -1.0], [1.0, 9.0, 1.0], mask=[True, False, True])
    loss, sums = losses.reinforce_tis(x, losses.LossConfig())
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([-0.5, 0.0, -0.5]))
    assert sums["tokens"] == 2 and sums["clamped_tokens"] == 0
    y, lp2 = _inputs([-1.0, -1.0], [-1.0, -1.0], [1.0, 1.0], weights=[1.0, 0.5])
    torch.testing.assert_close(
        _grad(losses.reinforce_tis(y, losses.LossConfig())[0], lp2), torch.tensor([-0.5, -0.25])
    )


def test_ess_is_the_normalised_effective_sample_size_of_the_weights() -> None:
    # weights 1,1,1,3 (clamp 5): ESS = 6^2 / (4 * 12) = 0.75
    lp = [-1.0, -1.0, -1.0, -1.0 + math.log(3.0)]
    x, _ = _inputs(lp, [-1.0] * 4, [1.0] * 4)
    m = losses.summarize(losses.reinforce_tis(x, losses.LossConfig())[1])
    assert m["ess"] == pytest.approx(0.75, rel=1e-5)
    assert m["is_weight_mean"] == pytest.approx(1.5, rel=1e-5)
    # Additive sums: metrics over two halves added = metrics over the whole.
    a = losses.reinforce_tis(_inputs(lp[:2], [-1.0] * 2, [1.0] * 2)[0], losses.LossConfig())[1]
    b = losses.reinforce_tis(_inputs(lp[2:], [-1.0] * 2, [1.0] * 2)[0], losses.LossConfig())[1]
    assert losses.summarize(losses.add_sums(a, b))["ess"] == pytest.approx(0.75, rel=1e-5)


@pytest.mark.parametrize("name", ["reinforce_tis", "reinforce"])
def test_the_behaviour_kl_penalty_adds_beta_times_k3_and_its_gradient(name: str) -> None:
    """From scratch: k3_t = r - 1 - log r, d/d logpi_t = (r - 1); the penalty adds beta * mean k3 to
    the loss and beta * (r_t - 1) / N to each token's gradient; masked tokens add nothing; a log-ratio
    beyond +-10 is held there (no gradient through the penalty)."""
    behaviour = [-1.0, -1.0, -2.0, -1.0, -3.0]
    log_r = [0.0, 0.4, -0.7, 0.2, 12.0]
    lp_vals = [b + d for b, d in zip(behaviour, log_r, strict=True)]
    adv = [1.0, -1.0, 0.5, 2.0, 1.0]
    mask = [True, True, True, False, True]
    beta, n = 0.3, 4
    x, lp = _inputs(lp_vals, behaviour, adv, mask=mask)
    y, lp_off = _inputs(lp_vals, behaviour, adv, mask=mask)
    with_kl, sums = losses.get(name)(x, losses.LossConfig(name, behaviour_kl=beta))
    without, sums_off = losses.get(name)(y, losses.LossConfig(name))
    held = [max(-10.0, min(10.0, d)) for d in log_r]
    k3 = [math.exp(d) - 1 - d if m else 0.0 for d, m in zip(held, mask, strict=True)]
    assert float(with_kl.detach() - without.detach()) == pytest.approx(beta * sum(k3) / n, rel=1e-5)
    extra = [
        beta * (math.exp(d) - 1) / n if m and abs(d) <= 10 else 0.0 for d, m in zip(log_r, mask, strict=True)
    ]
    torch.testing.assert_close(_grad(with_kl, lp) - _grad(without, lp_off), torch.tensor(extra))
    assert losses.summarize(sums)["kl_k3"] == pytest.approx(sum(k3) / n, rel=1e-5)
    assert losses.summarize(sums_off)["kl_k3"] == 0.0


def test_the_mean_k3_of_tokens_sampled_from_the_behaviour_policy_estimates_kl_behaviour_to_current() -> None:
    behaviour = torch.tensor([0.5, 0.3, 0.15, 0.05])
    current = torch.tensor([0.4, 0.4, 0.1, 0.1])
    exact = float((behaviour * (behaviour / current).log()).sum())
    tokens = torch.multinomial(
        behaviour, 200_000, replacement=True, generator=torch.Generator().manual_seed(0)
    )
    x, _ = _inputs(current.log()[tokens].tolist(), behaviour.log()[tokens].tolist(), [0.0] * len(tokens))
    assert float(losses.behaviour_kl_k3(x).detach()) == pytest.approx(exact, rel=0.03)


def test_unknown_loss_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"training.loss.name='ppo'.*reinforce_tis"):
        losses.get("ppo")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    import transformers

    d: pathlib.Path = tiny.build(tmp_path_factory.mktemp("tiny"))
    m: torch.nn.Module = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    return m


def test_rl_step_on_policy_has_unit_weights_and_finite_gradients(model: torch.nn.Module) -> None:
    rng = random.Random(3)
    seqs = []
    for p, c in [(4, 7), (6, 3), (3, 9)]:
        seqs.append(
            packing.TrainSequence(
                [rng.randrange(4, 80) for _ in range(p)],
                [rng.randrange(4, 80) for _ in range(c)],
                [0.0] * c,
                [0] * c,
                advantage=rng.uniform(-1, 1),
            )
        )
    cfg = step.RLConfig(temperature=0.8)
    mb = packing.collate(seqs, batch_tokens=19)
    with torch.no_grad():  # behaviour = what the sampler would record with these weights
        mb.behaviour_logprobs = torch.where(mb.loss_mask, step.token_logprobs(model, mb, 0.8), 0.0)
    model.zero_grad()
    loss_tis, sums = step.rl_step(model, mb, cfg)
    torch.autograd.backward(loss_tis)
    grads_tis = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    loss_pg, _ = step.rl_step(model, mb, step.RLConfig(loss=losses.LossConfig("reinforce"), temperature=0.8))
    torch.autograd.backward(loss_pg)
    grads_pg = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    m = losses.summarize(sums)
    assert m["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["ess"] == pytest.approx(1.0, abs=1e-6)
    assert m["clamp_frac"] == 0.0
    assert float(loss_tis.detach()) == pytest.approx(float(loss_pg.detach()), abs=1e-6)
    assert all(torch.isfinite(g).all() for g in grads_tis)
    for a, b in zip(grads_tis, grads_pg, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert sums["logprob_sum"] < 0 and sums["tokens"] == 19


def test_temperature_scales_the_logits(model: torch.nn.Module) -> None:
    seq = packing.TrainSequence([5, 6, 7], [8, 9], [0.0, 0.0], [0, 0], advantage=1.0)
    mb = packing.collate([seq], batch_tokens=2)
    with torch.no_grad():
        logits = model(input_ids=mb.input_ids, use_cache=False).logits[0]
        got = step.token_logprobs(model, mb, 0.5)
    ref = torch.log_softmax(logits / 0.5, dim=-1).gather(-1, mb.target_ids[:, None])[:, 0]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
