"""Fixtures for the operator tests: the chart installed into the control plane, and the operator
running as a local process with the chart's ServiceAccount credentials (never as admin).

- `chart` (session): `helm install` of helm/pipelinerl-operator (cluster-wide watch, peering on,
  replicaCount 0: the local process stands in for the Deployment's pod; webhook off: the API
  server here cannot reach a Service, so test_validation.py runs an operator that registers
  its own webhook instead, and test_chart.py checks the chart's webhook objects).
- `operator` (module): a `support.Operator` authenticated with a TokenRequest token of the chart's
  ServiceAccount.
- `demo_models` (session), `tiny` (function): the end-to-end tests' demo model and jobs (e2e.py).

Neighbours: tests/conftest.py (control plane, kubectl, helm, nodes), tests/operator/cluster/support.py.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.infra import binaries, controlplane, demo, nodes, tokens, tools
from tests.operator.cluster import e2e
from tests.operator.cluster.support import CHART, RELEASE, RELEASE_NS, SA_NAME, Chart, Operator

E2E_WARM_START_STEPS = 50


@pytest.fixture(scope="session")
def chart(control_plane: controlplane.Cluster) -> Iterator[Chart]:
    helm = tools.bind(binaries.ensure().helm, control_plane.kubeconfig)
    helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--create-namespace",
        "--set", "replicaCount=0,webhook.enabled=false", "--wait", "--timeout", "60s",
    )  # fmt: skip
    yield Chart(helm=helm, namespace=RELEASE_NS, service_account=SA_NAME)
    helm("uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait", "--timeout", "60s", check=False)


@pytest.fixture(scope="module")
def operator(
    chart: Chart,
    control_plane: controlplane.Cluster,
    core_api: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    work = tmp_path_factory.mktemp("operator")
    token = tokens.service_account_token(client.CoreV1Api(core_api), chart.namespace, chart.service_account)
    kubeconfig = tokens.token_kubeconfig(control_plane.kubeconfig, token, work / "operator.kubeconfig")
    op = Operator(kubeconfig, work)
    op.start()
    yield op
    op.stop()


# --------------------------------------------------------------------------- end-to-end


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The directory the example's `plrl-models` claim serves: `tiny/`, prepared once per session
    (fewer warm-start steps than `make cluster-up`: these tests check plumbing, not learning)."""
    models = tmp_path_factory.mktemp("models")
    demo.prepare_model(models, warm_start_steps=E2E_WARM_START_STEPS)
    return models


@pytest.fixture
def tiny_nodes() -> int:
    """Process-runner nodes in `tiny`'s pool; a test that needs more parametrizes this name."""
    return 1


@pytest.fixture
def tiny(
    request: pytest.FixtureRequest,
    tiny_nodes: int,
    kubectl: tools.Tool,
    namespace: str,
    gpu_nodes: Callable[..., nodes.Pool],
    demo_models: pathlib.Path,
    control_plane: controlplane.Cluster,
    tmp_path: pathlib.Path,
) -> Iterator[Callable[..., e2e.Tiny]]:
    """tiny(**spec) -> e2e.Tiny: examples/cluster-tiny.yaml with `spec` merged in, pinned to a fresh
    node (`tiny_nodes` of them) whose pods really run, with the example's claims bound to
    `demo_models` and to a fresh checkpoint directory (`.checkpoints`). Not applied yet: call
    `.apply()`."""
    from tests.infra import pod_net

    why = pod_net.available()
    if why is not None:  # CI runs as root; a developer's unprivileged machine gets told why
        pytest.skip(f"pods cannot run on this machine: {why}")
    pool = gpu_nodes(tiny_nodes, runner="process")
    checkpoints = tmp_path / "checkpoints"
    kubectl("apply", "-f", "-", input=demo.dump_all(demo.volumes(namespace, demo_models, checkpoints)))
    made: list[e2e.Tiny] = []
    failed_before = request.session.testsfailed

    def make(**spec: Any) -> e2e.Tiny:
        doc = demo.job(**demo.merge({"resources": {"nodeSelector": {nodes.POOL_LABEL: pool.name}}}, spec))
        job = e2e.Tiny(
            kubectl, namespace, doc, tmp_path / f"job-{len(made)}.yaml", checkpoints, control_plane.node_state
        )
        made.append(job)
        return job

    yield make
    if request.session.testsfailed > failed_before:
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            for job in made:
                print(f"\n===== {job.name}: kubectl describe =====")
                print(kubectl("describe", "plrljob", job.name, "-n", namespace, check=False).stdout[-4000:])
                print(kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout)
            print(f"===== worker logs ({namespace}) =====")
            print(made[0].log_tails() if made else "(no job)")
    # Stop the pods while the operator still runs (its finalizer), then drop the cluster-wide PVs.
    kubectl("delete", "plrljobs", "--all", "-n", namespace, "--wait=true", "--timeout=90s", check=False)
    kubectl("delete", "pv", "-l", f"plrl.dev/demo={namespace}", "--wait=false", check=False)
