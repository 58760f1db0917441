"""Packing: whole sequences into capacity-bounded micro-batches, per-token data aligned to targets,
equal micro-batch counts per rank, and (the point of it all) loss and gradients on a packed
micro-batch equal to the per-sequence computation, for sdpa and eager attention on CPU."""

from __future__ import annotations

import pathlib
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from plrl_workers.models import tiny
from plrl_workers.rl import losses, packing, step


def _seq(
    rng: random.Random, prompt: int, completion: int, advantage: float | None = None
) -> packing.TrainSequence:
    return packing.TrainSequence(
        prompt_ids=[rng.randrange(4, 80) for _ in range(prompt)],
        completion_ids=[rng.randrange(4, 80) for _ in range(completion)],
        behaviour_logprobs=[-rng.uniform(0.5, 6.0) for _ in range(completion)],
        versions=[rng.randrange(0, 3) for _ in range(completion)],
        advantage=rng.uniform(-1, 1) if advantage is None else advantage,
        weight=rng.choice([1.0, 0.5]),
    )


@given(st.lists(st.integers(1, 40), max_size=30), st.integers(40, 100))
def test_pack_keeps_every_sequence_whole_and_within_capacity(lengths: list[int], capacity: int) -> None:
    bins = packing.pack(lengths, capacity)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)
    # First-fit decreasing never leaves two bins that could have been one.
    loads = sorted(sum(lengths[i] for i in b) for b in bins)
    assert len(loads) < 2 or loads[0] + loads[1] > capacity


def test_pack_is_first_fit_decreasing_and_refuses_oversized_sequences() -> None:
    assert packing.pack([5, 9, 3, 7, 2], 10) == [[1], [2, 3], [0, 4]]
    with pytest.raises(ValueError, match="tokensPerMicroBatch=10"):
        packing.pack([4, 11], 10)


@given(st.lists(st.integers(1, 50), max_size=40), st.integers(1, 4))
def test_split_ranks_balances_tokens(lengths: list[int], world: int) -> None:
    shares = packing.split_ranks(lengths, world)
    assert len(shares) == world
    assert sorted(i for s in shares for i in s) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in s) for s in shares]
    assert max(loads) - min(loads) <= max(lengths, default=0)


def test_per_token_data_is_aligned_to_the_predicted_token() -> None:
    a = packing.TrainSequence([5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], [3, 4, 4], advantage=0.5, weight=0.25)
    b = packing.TrainSequence([10], [11], [-0.4], [5], advantage=-1.0)
    mb = packing.collate([a, b], batch_tokens=4)
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1]]
    assert mb.segment_ids.tolist() == [[0, 0, 0, 0, 0, 1, 1]]
    # Position t predicts token t+1: 6->7, 7->8, 8->9 carry loss; 9->10 crosses sequences: none.
    assert mb.target_ids.tolist() == [6, 7, 8, 9, 0, 11, 0]
    assert mb.loss_mask.tolist() == [False, True, True, True, False, True, False]
    assert mb.behaviour_logprobs.tolist() == pytest.approx([0, -0.1, -0.2, -0.3, 0, -0.4, 0])
    assert mb.versions.tolist() == [0, 3, 4, 4, 0, 5, 0]
    assert mb.advantages.tolist() == [0, 0.5, 0.5, 0.5, 0, -1.0, 0]
    assert mb.weights.tolist() == [0, 0.25, 0.25, 0.25, 0, 1.0, 0]
    assert (mb.num_sequences, mb.loss_tokens, mb.num_tokens) == (2, 4, 7)


def test_plan_gives_every_rank_the_same_number_of_micro_batches() -> None:
    rng = random.Random(0)
    seqs = [_seq(rng, rng.randint(2, 8), rng.randint(1, 12)) for _ in range(9)]
    per_rank = packing.plan(seqs, world_size=3, capacity=24)
    assert len({len(mbs) for mbs in per_rank}) == 1
    total = sum(len(s.completion_ids) for s in seqs)
    assert sum(mb.loss_tokens for mbs in per_rank for mb in mbs) == total
    assert all(mb.batch_tokens == total and mb.grad_scale == 3 for mbs in per_rank for mb in mbs)
    assert all(mb.num_tokens <= 24 for mbs in per_rank for mb in mbs)
    # More ranks than sequences: the idle rank gets an empty (one-token, no-loss) micro-batch.
    idle = packing.plan(seqs[:1], world_size=2, capacity=24)
    assert [len(m) for m in idle] == [1, 1]
    assert sorted(m[0].loss_tokens for m in idle) == [0, len(seqs[0].completion_ids)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tiny.build(tmp_path_factory.mktemp("tiny"))


def _model(model_dir: pathlib.Path, attn: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    m: torch.nn.Module = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation=attn
    )
    return m


def _loss_and_grads(
    model: torch.nn.Module, mbs: list[packing.MicroBatch], cfg: step.RLConfig
) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    total = 0.0
    for mb in mbs:
        loss, _ = step.rl_step(model, mb, cfg)
        torch.autograd.backward(loss)
        total += float(loss.detach())
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_the_per_sequence_computation(
    model_dir: pathlib.Path, attn: str
) -> None:
    model = _model(model_dir, attn)
    rng = random.Random(1)
    seqs = [_seq(rng, p, c) for p, c in [(5, 9), (3, 1), (8, 14), (2, 6), (6, 4)]]
    n = sum(len(s.completion_ids) for s in seqs)
    cfg = step.RLConfig(loss=losses.LossConfig("reinforce_tis", is_clamp=2.0), temperature=0.7)
    packed = packing.collate(seqs, batch_tokens=n)
    alone = [packing.collate([s], batch_tokens=n) for s in seqs]
    loss_p, grads_p = _loss_and_grads(model, [packed], cfg)
    loss_u, grads_u = _loss_and_grads(model, alone, cfg)
    assert loss_p == pytest.approx(loss_u, abs=1e-5)
    assert grads_p.keys() == grads_u.keys() and len(grads_p) > 10
    for name in grads_p:
        torch.testing.assert_close(grads_p[name], grads_u[name], atol=1e-5, rtol=0, msg=name)
    # The check can fail: continuous positions let the sequences attend to each other.
    leaky = packing.collate(seqs, batch_tokens=n)
    leaky.position_ids = torch.arange(leaky.num_tokens)[None]
    loss_leaky, _ = _loss_and_grads(model, [leaky], cfg)
    assert abs(loss_leaky - loss_u) > 1e-3


def test_a_kv_cache_would_break_isolation(model_dir: pathlib.Path) -> None:
    """Why `rl_step` passes use_cache=False: with a cache transformers ignores the packed positions."""
    model = _model(model_dir, "sdpa")
    rng = random.Random(2)
    seqs = [_seq(rng, 4, 6), _seq(rng, 5, 5)]
    mb = packing.collate(seqs, batch_tokens=11)
    with torch.no_grad():
        isolated = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits
        cached = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=True).logits
        first = model(input_ids=mb.input_ids[:, :10], use_cache=False).logits
    second_alone = model(input_ids=mb.input_ids[:, 10:], use_cache=False).logits.detach()
    torch.testing.assert_close(isolated[:, :10], first, atol=1e-5, rtol=0)
    torch.testing.assert_close(isolated[:, 10:], second_alone, atol=1e-5, rtol=0)
    assert (cached[:, 10:] - second_alone).abs().max() > 1e-3
