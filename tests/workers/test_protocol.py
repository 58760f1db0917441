"""`protocol.Sample` holds its per-token data as 1-D arrays with the wire's dtypes: an engine's lists are
converted once, arrays of the right dtype are kept without a copy, and anything not 1-D is refused
naming the field."""

from __future__ import annotations

import numpy
import pytest

from plrl_workers import protocol


def test_lists_become_arrays_with_the_wire_dtypes() -> None:
    s = protocol.Sample([3, 4], [-0.5, -1.25], [0, 1], 1.0, "stop")
    assert (s.token_ids.dtype, s.logprobs.dtype, s.versions.dtype) == (
        numpy.dtype(numpy.int32),
        numpy.dtype(numpy.float32),
        numpy.dtype(numpy.int32),
    )
    assert s.token_ids.tolist() == [3, 4] and s.logprobs.tolist() == [-0.5, -1.25]


def test_arrays_of_the_right_dtype_are_not_copied() -> None:
    ids = numpy.arange(5, dtype=numpy.int32)
    s = protocol.Sample(ids, numpy.zeros(5, numpy.float32), ids, 0.0, "length")
    assert s.token_ids is ids and s.versions is ids


def test_a_sample_that_is_not_one_dimensional_is_refused() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        protocol.Sample([1, 2], [[-0.1], [-0.2]], [0, 0], 0.0, "stop")
