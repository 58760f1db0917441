"""The torch engine's top-p nucleus is vLLM's, so both engines report the same behaviour logprobs."""

from __future__ import annotations

import pytest
import torch

from plrl_workers.engines import sampling


@pytest.mark.vllm
def test_top_p_mask_is_vllms() -> None:
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    logits = torch.randn(8, 200, generator=torch.Generator().manual_seed(3)) * 3
    top_p = torch.tensor([1.0, 0.9, 0.5, 0.1, 0.99, 0.7, 0.3, 1.0])
    temp = torch.tensor([1.0, 0.7, 1.3, 1.0, 0.5, 1.0, 2.0, 0.9])
    ours = sampling.processed_logits(logits, temp, top_p).log_softmax(-1)
    theirs = ops.apply_top_k_top_p_pytorch(logits / temp[:, None], None, top_p).log_softmax(-1)
    assert torch.equal(ours.isinf(), theirs.isinf())
    finite = ~ours.isinf()
    torch.testing.assert_close(ours[finite], theirs[finite])
