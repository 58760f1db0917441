"""The torch engine's sampler: the behaviour-logprob definition, the top-p nucleus, the draws.

Cases: logprobs are log_softmax(logits / T) with top_p = 1 and greedy uses T = 1; the top-p mask is
vLLM's own (so both engines report the same logprobs); draws from the exponential race follow the
processed distribution; greedy rows ignore the noise. (That the top-p mask is vLLM's own is
checked in `tests/workers/engines/test_sampling_vllm.py`.)
"""

from __future__ import annotations

import torch

from plrl_workers.engines import sampling


def _logits(rows: int = 6, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_logprob_is_the_tempered_distribution_and_greedy_uses_t_1() -> None:
    logits = _logits()
    temp = torch.tensor([0.0, 0.5, 1.0, 1.5, 0.0, 2.0])
    noise = torch.empty_like(logits).exponential_(generator=torch.Generator().manual_seed(1))
    tokens, lp = sampling.sample(logits, temp, torch.ones(6), noise)
    t = torch.where(temp == 0, torch.ones_like(temp), temp)
    expected = (logits / t[:, None]).log_softmax(-1).gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(lp, expected)
    assert tokens[0] == logits[0].argmax() and tokens[4] == logits[4].argmax()


def test_top_p_keeps_the_smallest_nucleus_and_renormalises() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    out = sampling.processed_logits(logits, torch.ones(1), torch.tensor([0.75]))
    # 0.5 + 0.3 >= 0.75: the two tail tokens are dropped, the rest renormalised.
    torch.testing.assert_close(out.softmax(-1), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


def test_draws_follow_the_processed_distribution() -> None:
    n = 40_000
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1])).repeat(n, 1)
    noise = torch.empty_like(logits).exponential_(generator=torch.Generator().manual_seed(2))
    tokens, _ = sampling.sample(logits, torch.full((n,), 1.0), torch.full((n,), 0.85), noise)
    freq = torch.bincount(tokens, minlength=4).float() / n
    # top_p 0.85 drops the 0.1 token; the rest are 0.4/0.9, 0.3/0.9, 0.2/0.9 (+- 4 sigma).
    torch.testing.assert_close(freq, torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0]), atol=0.01, rtol=0)
