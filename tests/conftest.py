"""Fixtures shared by the whole suite: the local Kubernetes control plane and the tools that talk to it.

- `control_plane` (session): a real control plane (tests/infra/controlplane.py), started once; or the
  cluster of `make cluster-up` when PLRL_KUBECONFIG names its kubeconfig. Every test that uses it,
  directly or through another fixture, gets the `cluster` marker (so `-m "not cluster"` skips them).
- `kubectl`, `helm`: run the tool against that cluster; return the CompletedProcess (text).
- `core_api`: a kubernetes.client.ApiClient for it (admin). `namespace`: a fresh namespace per test.
- `gpu_nodes`: makes a pool of fake GPU nodes (tests/infra/nodes.py), deleted after the test.
- `prepared_model_cache` (session, automatic): the runs of one test session share a cache of prepared
  built-in models of their own (PLRL_CACHE_DIR), so the first run builds and the rest reuse, and
  nothing is read from or left in the user's ~/.cache.

The binaries are built (cold: many minutes) after collection, before the first test, so the build
never counts against a test's timeout.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import hypothesis
import pytest
import yaml

from tests.infra import binaries, controlplane, tools

if TYPE_CHECKING:
    # Imported inside the fixtures that need them: engine and trainer tests run on machines without
    # the Kubernetes client (the GPU check's image), and must collect there.
    from kubernetes import client

    from tests.infra import nodes

CLUSTER_FIXTURE = "control_plane"

# Property tests explore the same examples on every run, so CI is repeatable; run with
# `--hypothesis-profile=explore` to search afresh.
hypothesis.settings.register_profile("ci", derandomize=True, deadline=None)
hypothesis.settings.register_profile("explore", deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("PLRL_KUBECONFIG") or session.config.option.collectonly:
        return
    if any(CLUSTER_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            binaries.ensure()


@pytest.hookimpl(tryfirst=True)  # before -m deselects, so `-m "not cluster"` sees the marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if CLUSTER_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session", autouse=True)
def prepared_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    cache = tmp_path_factory.mktemp("plrl-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLRL_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.Cluster]:
    reuse = os.environ.get("PLRL_KUBECONFIG")
    if reuse:
        path = pathlib.Path(reuse)
        server = yaml.safe_load(path.read_text())["clusters"][0]["cluster"]["server"]
        state = path.parent / "node-agent"  # `make cluster-up` keeps the layout of ControlPlane's work dir
        yield controlplane.Cluster(
            kubeconfig=path, server=server, logs=None, node_state=state if state.is_dir() else None
        )
        return
    with controlplane.ControlPlane(tmp_path_factory.mktemp("controlplane")).start() as cp:
        yield controlplane.Cluster(
            kubeconfig=cp.kubeconfig, server=cp.server, logs=cp.logs, node_state=cp.node_state
        )


@pytest.fixture
def kubectl(control_plane: controlplane.Cluster) -> tools.Tool:
    """kubectl (from the venv) with KUBECONFIG set to the cluster's admin kubeconfig; check=True raises
    with stdout/stderr on a non-zero exit."""
    return tools.bind(binaries.kubectl(), control_plane.kubeconfig)


@pytest.fixture
def helm(control_plane: controlplane.Cluster) -> tools.Tool:
    return tools.bind(binaries.ensure().helm, control_plane.kubeconfig)


@pytest.fixture(scope="session")
def core_api(control_plane: controlplane.Cluster) -> Iterator[client.ApiClient]:
    """An admin kubernetes.client.ApiClient; wrap it in client.CoreV1Api(...) and friends."""
    from tests.infra import kube

    api = kube.api_client(control_plane.kubeconfig)
    yield api
    api.close()


@pytest.fixture
def namespace(core_api: client.ApiClient) -> Iterator[str]:
    """A fresh namespace, deleted (without waiting) after the test."""
    from kubernetes import client

    from tests.infra import kube

    name = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(core_api)
    core.create_namespace(kube.model(client.V1Namespace, {"metadata": {"name": name}}))
    yield name
    core.delete_namespace(name)


@pytest.fixture
def gpu_nodes(core_api: client.ApiClient) -> Iterator[Callable[..., nodes.Pool]]:
    """gpu_nodes(count, **GpuNode fields) -> Pool: creates `count` fake GPU nodes carrying a
    `plrl.dev/pool` label unique to the call (for nodeSelectors); all are deleted after the test."""
    from kubernetes import client

    from tests.infra import nodes

    core = client.CoreV1Api(core_api)
    made: list[str] = []

    def make(count: int = 1, **fields: Any) -> nodes.Pool:
        pool = nodes.Pool.fresh(count)
        labels = {nodes.POOL_LABEL: pool.name, **fields.pop("labels", {})}
        made.extend(nodes.create(core, [nodes.GpuNode(name=n, labels=labels, **fields) for n in pool.nodes]))
        return pool

    yield make
    nodes.delete(core, made)
