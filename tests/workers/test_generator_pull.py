"""A generator's full-weights pull waits for weights its trainer has not published yet.

Cases: a trainer that resumed from a checkpoint registers generators at its weight version just before
publishing those weights, so a pull is refused UNAVAILABLE for a moment: the generator asks again and
loads them; any other refusal (or UNAVAILABLE past the wait) is raised; a refusal from another
coordinator than the one it registered with (trainer rank 0 restarted) ends the pull in a reconnect.
"""

from __future__ import annotations

import types
from typing import Any

import grpc
import pytest

from plrl_workers import generator
from plrl_workers.engines import base as engines
from plrl_workers.rpc import client


class _Refused(grpc.RpcError):  # type: ignore[misc]  # grpc ships no stubs
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return str(self._code.name)


class _Coord:
    def __init__(self, refusals: list[grpc.StatusCode], session: str = "") -> None:
        self.refusals = refusals
        self.calls = 0
        self.session = session  # the generator registered with "" (it never registered here)

    def status(self) -> Any:
        return types.SimpleNamespace(session=self.session)

    def pull_weights(self, generator_id: str, min_version: int = 0) -> client.PulledWeights:
        self.calls += 1
        if self.refusals:
            raise _Refused(self.refusals.pop(0))
        return client.PulledWeights(version=min_version, params=(), named_tensors=iter(()))


class _Engine:
    weight_version = 0

    def update_weights(self, named: Any, version: int) -> None:
        self.weight_version = version


def _generator(coord: _Coord) -> generator.Generator:
    engine: Any = _Engine()
    coord_any: Any = coord
    params = engines.SamplingParams(max_new_tokens=1)
    return generator.Generator("gen-0", engine, coord_any, None, lambda *a: 0.0, params, 1)


def test_a_pull_waits_for_weights_not_published_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generator, "PULL_RETRY_S", 0.01)
    coord = _Coord([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE])
    gen = _generator(coord)
    gen._pull(10)
    assert coord.calls == 3 and gen.engine.weight_version == 10


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT])
def test_other_refusals_are_raised(code: grpc.StatusCode) -> None:
    coord = _Coord([code])
    with pytest.raises(grpc.RpcError):
        _generator(coord)._pull(10)
    assert coord.calls == 1


def test_unavailable_past_the_wait_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generator, "PULL_WAIT_S", 0.0)
    coord = _Coord([grpc.StatusCode.UNAVAILABLE] * 5)
    with pytest.raises(grpc.RpcError):
        _generator(coord)._pull(10)


def test_a_refusal_by_a_restarted_coordinator_ends_the_pull_in_a_reconnect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(generator, "PULL_RETRY_S", 0.01)
    coord = _Coord([grpc.StatusCode.UNAVAILABLE] * 5, session="successor")
    gen = _generator(coord)
    gen._pull(10)
    assert coord.calls == 1 and gen.engine.weight_version == 0
    assert "went away while weights v10 were pulled" in gen._gone


def test_a_refused_pull_asks_whose_session_it_is_at_most_every_few_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(generator, "PULL_RETRY_S", 0.01)
    coord = _Coord([grpc.StatusCode.UNAVAILABLE] * 5)
    asked: list[float] = []
    status = coord.status

    def counted_status() -> Any:
        asked.append(0.0)
        return status()

    monkeypatch.setattr(coord, "status", counted_status)
    _generator(coord)._pull(10)
    assert coord.calls == 6 and len(asked) == 1
