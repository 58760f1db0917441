"""Fixtures for the operator tests: the chart installed into the control plane, and the operator
running as a local process with the chart's ServiceAccount credentials (never as admin).

- `chart` (session): `helm install` of helm/pipelinerl-operator (cluster-wide watch, peering on,
  replicaCount 0: the local process stands in for the Deployment's pod; webhook off: the API
  server here cannot reach a Service, so test_validation.py runs an operator that registers
  its own webhook instead, and test_chart.py checks the chart's webhook objects).
- `operator` (module): a `support.Operator` authenticated with a TokenRequest token of the chart's
  ServiceAccount.

Neighbours: tests/conftest.py (control plane, kubectl, helm, nodes), tests/operator/cluster/support.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.infra import binaries, controlplane, tokens, tools
from tests.operator.cluster.support import CHART, RELEASE, RELEASE_NS, SA_NAME, Chart, Operator


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
