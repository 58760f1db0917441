"""The torch engine is not Qwen2-only: a Llama-architecture model (SmolLM2's) decodes with exact logprobs.

Llama's decoder builds its attention mask differently from Qwen2's (no per-layer-type mask mapping),
so this runs the contract's core check, continuous batching over more requests than slots with
logprobs equal to a teacher-forced transformers pass, on a tiny random Llama.
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from plrl_workers.engines import base, factory
from plrl_workers.models import tiny
from tests.workers.engines import reference

TOL = 1e-3


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    import transformers

    out = tmp_path_factory.mktemp("tiny-llama")
    vocab = tiny.vocabulary()
    cfg = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=vocab[tiny.BOS],
        eos_token_id=vocab[tiny.EOS],
        pad_token_id=vocab[tiny.PAD],
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(out))
    tiny.save_tokenizer(out)
    return out


def test_llama_decodes_with_continuous_batching_and_exact_logprobs(llama_dir: pathlib.Path) -> None:
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32).eval()
    weights = {n: p.detach().clone() for n, p in ref.named_parameters()}
    eng = factory.generation_engine(
        "torch", base.EngineOptions(str(llama_dir), max_concurrent=3, max_model_len=64)
    )
    try:
        prompts = [[5, 6, 7], [12, 13, 14, 15, 16], [20], [30, 31], [40, 41, 42, 43]]
        for i, p in enumerate(prompts):
            eng.add_request(f"r{i}", p, base.SamplingParams(max_new_tokens=4 + i, temperature=1.0, seed=i))
        done, _ = reference.run(eng)
    finally:
        eng.close()
    assert sorted(done) == [f"r{i}" for i in range(len(prompts))]
    for seq in done.values():
        expected = reference.teacher_forced(ref, seq, 1.0, [weights])
        torch.testing.assert_close(torch.tensor(seq.logprobs), expected, atol=TOL, rtol=0)
