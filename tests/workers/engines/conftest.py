"""Shared fixtures for the engine tests: the built-in tiny model, built once per session."""

from __future__ import annotations

import pathlib

import pytest

from plrl_workers.models import tiny


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tiny.build(tmp_path_factory.mktemp("tiny-model"))
