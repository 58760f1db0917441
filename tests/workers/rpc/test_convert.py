"""The rollout batch trainer rank 0 broadcasts to its peers (issue 11, finding 10): protobuf bytes,
not a pickle. Round trip exact; bytes it did not make are refused, never executed."""

from __future__ import annotations

import pickle

import numpy
import pytest

from plrl_workers import protocol
from plrl_workers.rpc import convert


def _group(k: int) -> protocol.RolloutGroup:
    samples = [
        protocol.Sample(
            [5 + i, 6, 7], [-0.5, -1.25, -2.0], [k, k, k + 1], float(i), "stop" if i else "length"
        )
        for i in range(3)
    ]
    return protocol.RolloutGroup(f"lease-{k}", 100 + k, [1, 2, k], samples, f"gen-{k % 2}")


def test_groups_round_trip_exactly() -> None:
    groups = [_group(k) for k in range(4)]
    back = convert.groups_from_bytes(convert.groups_to_bytes(groups))
    assert [(g.lease_id, g.prompt_id, list(g.prompt_token_ids), g.generator_id) for g in back] == [
        (g.lease_id, g.prompt_id, list(g.prompt_token_ids), g.generator_id) for g in groups
    ]
    for got, want in zip(back, groups, strict=True):
        for s, t in zip(got.samples, want.samples, strict=True):
            assert list(s.token_ids) == list(t.token_ids) and list(s.versions) == list(t.versions)
            numpy.testing.assert_array_equal(s.logprobs, numpy.asarray(t.logprobs, dtype=numpy.float32))
            assert (s.reward, s.finish_reason) == (t.reward, t.finish_reason)
    assert convert.groups_from_bytes(convert.groups_to_bytes([])) == []


def test_bytes_it_did_not_make_are_refused() -> None:
    data = convert.groups_to_bytes([_group(0), _group(1)])
    with pytest.raises(ValueError, match="runs past the end"):
        convert.groups_from_bytes(data[:-3])
    with pytest.raises(ValueError, match="trailing bytes"):
        convert.groups_from_bytes(data + b"\x01")
    with pytest.raises(ValueError):  # a pickle is data of the wrong shape here, never run
        convert.groups_from_bytes(pickle.dumps([_group(0)]))
