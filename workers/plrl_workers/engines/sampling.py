"""Token sampling for the torch engine, and the one definition of a behaviour logprob.

The behaviour logprob of a sampled token is its log-probability under the distribution that
actually drew it:

    logits' = logits / T          (T = temperature; T == 0 means greedy and is treated as T = 1)
    logits' = top_p_mask(logits') (tokens outside the top-p nucleus get -inf; with top_p == 1
                                   nothing is masked)
    logprob = log_softmax(logits')[token]

This is vLLM's `logprobs_mode="processed_logprobs"`, which the vLLM engine is started with, so
both engines report the same number. With the RL default top_p == 1 it is simply
`log_softmax(logits / T)`, which is what a trainer must compute for pi_theta (same T) for the
importance ratio pi_theta / pi_behaviour to be 1 on-policy. With top_p < 1 a trainer that skips
the nucleus mask sees ratios below 1 for sampled tokens; that is the trainer's choice to make.

Neighbours: `engines/torch_engine.py` (the caller), `rl/` (the trainer side of the definition).
"""

from __future__ import annotations

import torch

# vLLM's threshold below which a temperature means greedy decoding.
GREEDY_EPS = 1e-5


def processed_logits(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Temperature, then top-p, exactly as vLLM's sampler applies them (float32, [B, V])."""
    t = torch.where(temperature < GREEDY_EPS, torch.ones_like(temperature), temperature)
    out = logits.float() / t.unsqueeze(1)
    if bool((top_p < 1.0).any()):
        # Ascending sort; drop the low tail whose cumulative mass is <= 1 - p, keep at least one.
        sorted_logits, idx = out.sort(dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1.0 - top_p).unsqueeze(1)
        drop[:, -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        out = out.scatter(-1, idx, sorted_logits)
    return out


def sample(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return (token ids [B], behaviour logprobs [B]).

    `noise` holds i.i.d. Exp(1) draws ([B, V]); argmax(p / noise) is an exact draw from p (the
    exponential race), so the caller controls randomness per row through its generators. Greedy
    rows (temperature < GREEDY_EPS) ignore the noise and take the argmax.
    """
    proc = processed_logits(logits, temperature, top_p)
    logprobs = proc.log_softmax(dim=-1)
    drawn = (logprobs.exp() / noise).argmax(dim=-1)
    greedy = proc.argmax(dim=-1)
    tokens = torch.where(temperature < GREEDY_EPS, greedy, drawn)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(1)).squeeze(1)
