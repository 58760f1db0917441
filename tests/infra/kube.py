"""Small typed glue over the kubernetes client (its models are pydantic; a few entry points are untyped):
an ApiClient from a kubeconfig, and a model built from a plain manifest dict.

Neighbours: every module here that talks to the API server.
"""

from __future__ import annotations

import pathlib
from typing import Any, Protocol, TypeVar

from kubernetes import client, config

M = TypeVar("M", covariant=True)


class _FromDict(Protocol[M]):
    @classmethod
    def from_dict(cls, obj: dict[str, Any] | None) -> M | None: ...


def api_client(kubeconfig: pathlib.Path) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))
    return api


def model(cls: type[_FromDict[M]], manifest: dict[str, Any]) -> M:
    """The client model `cls` for a manifest written as the API's JSON (camelCase keys)."""
    obj = cls.from_dict(manifest)
    if obj is None:
        raise ValueError(f"{cls.__name__}: empty manifest")
    return obj
