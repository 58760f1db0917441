"""Reference computations for engine tests: drive an engine to completion, swap weights in a plain
transformers model, and teacher-force a finished sequence through it (also across weight updates).

Used by `tests/workers/engines/test_contract.py`; anything that checks an engine's logprobs can use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch

from plrl_workers.engines import base
from plrl_workers.models import tiny

EOS = tiny.vocabulary()[tiny.EOS]


def run(
    eng: base.GenerationEngine, max_steps: int = 400
) -> tuple[dict[str, base.FinishedSequence], dict[str, int]]:
    """Step until nothing is in flight; return sequences and the step index each finished at."""
    done: dict[str, base.FinishedSequence] = {}
    at: dict[str, int] = {}
    for i in range(max_steps):
        if not eng.num_in_flight():
            return done, at
        for seq in eng.step():
            assert seq.request_id not in done, f"{seq.request_id} returned twice"
            seq.check()
            done[seq.request_id], at[seq.request_id] = seq, i
    raise AssertionError(f"still {eng.num_in_flight()} in flight after {max_steps} steps")


@contextlib.contextmanager
def holding(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> Iterator[None]:
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(weights[n])
    try:
        yield
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])


def teacher_forced(
    model: torch.nn.Module,
    seq: base.FinishedSequence,
    temperature: float,
    weights: list[Mapping[str, torch.Tensor]],
    splits: tuple[int, ...] = (),
) -> torch.Tensor:
    """Logprobs of `seq`'s tokens from transformers, teacher-forced.

    Tokens from `splits[j-1]` on (the first from 0) come from `weights[j]`, which also writes the KV
    entries of the inputs it reads; later weights read those entries as they are. That is what an
    engine that keeps its cache across updates computes. With one entry in `weights` it is a plain
    forward pass."""
    assert len(weights) == len(splits) + 1
    prompt, toks = list(seq.prompt_token_ids), seq.token_ids
    ids = torch.tensor([prompt + toks[:-1]])
    # Token i is predicted from input len(prompt) - 1 + i.
    bounds = [0, *(len(prompt) - 1 + k for k in splits), ids.shape[1]]
    cache = None
    parts = []
    with torch.no_grad():
        for w, lo, hi in zip(weights, bounds, bounds[1:], strict=False):
            if hi <= lo:
                continue
            with holding(model, w):
                out = model(ids[:, lo:hi], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            parts.append(out.logits[0])
    logits = torch.cat(parts)[len(prompt) - 1 :]
    lp = (logits.float() / (temperature or 1.0)).log_softmax(-1)
    return lp.gather(1, torch.tensor(toks)[:, None])[:, 0]


def perturbed(
    original: Mapping[str, torch.Tensor], seed: int, scale: float = 0.02
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: p + scale * torch.randn(p.shape, generator=g) for n, p in original.items()}


def eos_forcing(original: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights whose next token is EOS after any prefix: the last layer attends uniformly (q = 0)
    to values whose newest entry is 1e4 * embedding(EOS), copied to the residual stream by an
    identity o_proj; with tied embeddings the EOS logit then dominates."""
    w = dict(original)
    last = f"model.layers.{sum(1 for n in original if n.endswith('self_attn.o_proj.weight')) - 1}"
    a = f"{last}.self_attn"
    for n in (f"{a}.q_proj.weight", f"{a}.q_proj.bias", f"{a}.v_proj.weight", f"{last}.mlp.down_proj.weight"):
        w[n] = torch.zeros_like(original[n])
    w[f"{a}.v_proj.bias"] = 1e4 * original["model.embed_tokens.weight"][EOS]
    w[f"{a}.o_proj.weight"] = torch.eye(original[f"{a}.o_proj.weight"].shape[0])
    return w
