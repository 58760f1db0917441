"""The two implementations of the per-token rollout rules (lists for in-process callers, numpy for the
RPC path) give the same verdict on the same sample, including every way a sample can be wrong."""

from __future__ import annotations

import math

import hypothesis
import hypothesis.strategies as st
import numpy

from plrl_workers import coordinator_checks, types

CURRENT = 3
VOCAB = 50


@st.composite
def samples(draw: st.DrawFn) -> types.Sample:
    n = draw(st.integers(min_value=0, max_value=6))
    tokens = draw(st.lists(st.integers(min_value=-2, max_value=VOCAB + 2), min_size=n, max_size=n))
    logprob = st.one_of(
        st.floats(min_value=-30.0, max_value=0.0, width=32),
        st.sampled_from([math.nan, -math.inf, math.inf, 0.5]),
    )
    logprobs = draw(st.lists(logprob, min_size=n, max_size=n + draw(st.integers(0, 1))))
    versions = draw(st.lists(st.integers(min_value=-1, max_value=CURRENT + 1), min_size=n, max_size=n))
    if draw(st.booleans()):
        versions.sort()
    return types.Sample(tokens, logprobs, versions, reward=0.0, finish_reason="stop")


@hypothesis.settings(max_examples=300)
@hypothesis.given(samples())
def test_list_and_array_checks_agree(s: types.Sample) -> None:
    by_lists = coordinator_checks._check_sample(s, CURRENT, VOCAB)
    by_arrays = coordinator_checks.check_sample_arrays(
        numpy.asarray(s.token_ids, dtype=numpy.int32),
        numpy.asarray(s.logprobs, dtype=numpy.float32),
        numpy.asarray(s.versions, dtype=numpy.int32),
        current_version=CURRENT,
        vocab_size=VOCAB,
    )
    assert (by_lists is None) == (by_arrays is None), (by_lists, by_arrays)
    if by_lists is not None and by_arrays is not None:
        assert by_lists == by_arrays
