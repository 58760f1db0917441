"""The committed protobuf/gRPC modules are exactly what `make proto` generates from rpc/plrl.proto."""

from __future__ import annotations

import pathlib

from plrl_workers.rpc import codegen


def test_generated_code_matches_the_proto(tmp_path: pathlib.Path) -> None:
    fresh = {p.name: p.read_bytes() for p in codegen.generate(tmp_path)}
    committed = {p.name: p.read_bytes() for p in sorted(codegen.GENERATED.glob("*.py*"))}
    assert sorted(fresh) == sorted(committed), "generated file set differs: run `make proto`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"{stale} differ from rpc/plrl.proto: run `make proto` and commit"
