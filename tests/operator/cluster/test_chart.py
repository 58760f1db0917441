"""The Helm chart: lint, template in both watch modes, and install into the control plane.

Cases: `helm lint` passes for the default and the namespaced values; `helm template` renders the
operator Deployment (non-root, read-only root, probes, the right flags), the metrics Service,
least-privilege RBAC (no `delete` anywhere; Roles only in the listed namespaces when namespaced)
and the peering objects; after `helm install` the CRD is served (`kubectl explain` shows the
descriptions from spec.py) and the chart's ServiceAccount may do what the operator needs and no
more.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.infra import tools
from tests.operator.cluster import support

pytestmark = pytest.mark.cluster
NAMESPACED = ("--set", "watch.namespaces={team-a,team-b}")


def _template(helm: tools.Tool, *args: str) -> list[dict[str, Any]]:
    out = helm(
        "template", "plrl", str(support.CHART), "--namespace", "plrl-system", "--kube-version=1.37.0", *args
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _kinds(docs: list[dict[str, Any]]) -> dict[tuple[str, str | None], dict[str, Any]]:
    return {(d["kind"], d["metadata"].get("namespace")): d for d in docs}


@pytest.mark.parametrize("values", [(), NAMESPACED, ("--set", "peering.enabled=false,metrics.enabled=false")])
def test_helm_lint(helm: tools.Tool, values: tuple[str, ...]) -> None:
    out = helm("lint", "--strict", str(support.CHART), *values)
    assert "0 chart(s) failed" in out.stdout


def test_template_cluster_wide(helm: tools.Tool) -> None:
    docs = _template(helm)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering", "Deployment", "Service"]
    )
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["args"][:2] == ["--all-namespaces", "--peering=pipelinerl-operator"]
    assert {"livenessProbe", "readinessProbe", "startupProbe"} <= c.keys()
    assert c["image"] == "ghcr.io/pipelinerl/plrl-operator:0.1.0"
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["ports"][0]["port"] == 9090
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "delete" not in verbs and "*" not in verbs, "children are garbage-collected; no delete needed"
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert {
        "pipelinerljobs",
        "pipelinerljobs/status",
        "statefulsets",
        "leases",
        "clusterkopfpeerings",
    } <= resources


def test_template_namespaced(helm: tools.Tool) -> None:
    docs = _kinds(_template(helm, *NAMESPACED))
    for ns in ("team-a", "team-b"):
        role = docs[("Role", ns)]
        assert any("pipelinerljobs" in r["resources"] for r in role["rules"])
        assert docs[("RoleBinding", ns)]["subjects"][0]["namespace"] == "plrl-system"
        assert ("KopfPeering", ns) in docs
    cluster_role = docs[("ClusterRole", None)]
    assert [r["resources"] for r in cluster_role["rules"]] == [["customresourcedefinitions"]]
    args = docs[("Deployment", "plrl-system")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--namespace=team-a", "--namespace=team-b"]


def test_installed_crd_and_service_account_permissions(chart: support.Chart, kubectl: tools.Tool) -> None:
    explain = kubectl("explain", "plrljob.spec.training.batchSize").stdout
    assert "B: samples per optimizer step" in explain
    assert "plrljob" in kubectl("api-resources", "--api-group=pipelinerl.io").stdout
    sa = f"system:serviceaccount:{chart.namespace}:{chart.service_account}"

    def can(verb: str, resource: str) -> str:
        return kubectl(
            "auth", "can-i", verb, resource, f"--as={sa}", "-n", "default", check=False
        ).stdout.strip()

    assert can("patch", "pipelinerljobs.pipelinerl.io/status") == "yes"
    assert can("create", "statefulsets.apps") == "yes"
    assert can("create", "leases.coordination.k8s.io") == "yes"
    assert can("delete", "statefulsets.apps") == "no"
    assert can("delete", "pipelinerljobs.pipelinerl.io") == "no"
    assert can("get", "secrets") == "no"
    assert can("create", "pods") == "no"
