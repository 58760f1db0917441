"""The Helm chart: lint, template in both watch modes, and install into the control plane.

Cases: `helm lint` passes for the default, the namespaced and the minimal values; `helm template`
renders the operator Deployment (non-root, read-only root, probes, the right flags), the metrics
Service, least-privilege RBAC (`delete` only on pods, to replace a hung worker; Roles only in the
listed namespaces when namespaced; nothing on webhook configurations; no Roles written, only the
worker ClusterRole bound, by name) and the peering objects; the
admission webhook is wired (a CA and a serving certificate for the webhook Service in a TLS Secret,
mounted where the operator's flags read it; the Service; a ValidatingWebhookConfiguration that fails
closed, with a short timeout, for PipelineRLJob creates and updates only, trusting that CA; scoped
to the watched namespaces) and absent with `webhook.enabled=false`; after `helm install` the CRD is
served (`kubectl explain` shows the descriptions from spec.py) and the chart's ServiceAccount may do
what the operator needs and no more (`kubectl auth can-i --as` it).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from plrl_operator import admission
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
    return {(d["kind"], d["metadata"].get("namespace")): d for d in docs if d["kind"] != "ClusterRole"}


def _cluster_roles(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}


WORKER_ROLE = f"{support.SA_NAME}-worker"


def _check_worker_role(docs: list[dict[str, Any]]) -> None:
    """The workers' ClusterRole holds Leases and nothing else; the operator is told its name."""
    worker = _cluster_roles(docs)[WORKER_ROLE]
    rules = [(r["apiGroups"], r["resources"]) for r in worker["rules"]]
    assert rules == [(["coordination.k8s.io"], ["leases"])]
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--worker-cluster-role={WORKER_ROLE}" in args


MINIMAL = ("--set", "peering.enabled=false,metrics.enabled=false,webhook.enabled=false")


@pytest.mark.parametrize("values", [(), NAMESPACED, MINIMAL])
def test_helm_lint(helm: tools.Tool, values: tuple[str, ...]) -> None:
    out = helm("lint", "--strict", str(support.CHART), *values)
    assert "0 chart(s) failed" in out.stdout


def test_template_cluster_wide(helm: tools.Tool) -> None:
    docs = _template(helm)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering",
            "Deployment", "Service", "Service", "Secret", "ValidatingWebhookConfiguration",
        ]
    )  # fmt: skip
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["args"][:2] == ["--all-namespaces", "--peering=pipelinerl-operator"]
    assert {"livenessProbe", "readinessProbe", "startupProbe"} <= c.keys()
    assert c["image"] == "ghcr.io/pipelinerl/plrl-operator:0.1.0"
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics"))
    assert svc["spec"]["ports"][0]["port"] == 9090
    _check_worker_role(docs)
    role = _cluster_roles(docs)[support.SA_NAME]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in verbs
    # Children are garbage-collected; the one delete is of a hung worker's pod.
    deletes = [r for rule in role["rules"] if "delete" in rule["verbs"] for r in rule["resources"]]
    assert deletes == ["pods"]
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert {
        "pipelinerljobs",
        "pipelinerljobs/status",
        "statefulsets",
        "leases",
        "clusterkopfpeerings",
    } <= resources
    groups = {g for rule in role["rules"] for g in rule["apiGroups"]}
    assert "admissionregistration.k8s.io" not in groups, "the chart installs the webhook configuration"
    rbac = [r for r in role["rules"] if r["apiGroups"] == ["rbac.authorization.k8s.io"]]
    # Binds the workers' ClusterRole, by name; writes no role.
    assert [(r["resources"], r["verbs"], r.get("resourceNames")) for r in rbac] == [
        (["rolebindings"], ["get", "list", "create", "patch"], None),
        (["clusterroles"], ["bind"], [WORKER_ROLE]),
    ]


def test_template_wires_the_admission_webhook(helm: tools.Tool) -> None:
    docs = _template(helm)
    secret = next(d for d in docs if d["kind"] == "Secret")
    vwc = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-webhook"))
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    # The certificate: signed by the CA the API server is told to trust, for the Service's names.
    assert secret["type"] == "kubernetes.io/tls"
    pem = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    ca, cert = x509.load_pem_x509_certificate(pem["ca.crt"]), x509.load_pem_x509_certificate(pem["tls.crt"])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = f"{svc['metadata']['name']}.plrl-system.svc"
    assert dns in names.get_values_for_type(x509.DNSName)
    assert serialization.load_pem_private_key(pem["tls.key"], None).public_key() == cert.public_key()
    # The configuration: fail closed, quickly, for PipelineRLJob creates and updates only.
    (hook,) = vwc["webhooks"]
    assert (hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"]) == ("Fail", "None", 5)
    assert hook["rules"] == [
        {
            "apiGroups": ["pipelinerl.io"],
            "apiVersions": ["v1alpha1"],
            "resources": ["pipelinerljobs"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == pem["ca.crt"]
    assert hook["clientConfig"]["service"] == {
        "name": svc["metadata"]["name"],
        "namespace": "plrl-system",
        "port": 443,
        "path": f"/{admission.HANDLER_ID}",
    }
    assert "namespaceSelector" not in hook  # cluster-wide watch: every namespace
    assert svc["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    # The operator: serves it on the port the Service targets, from the Secret's files.
    pod = deploy["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert {"--webhook-port=9443", "--webhook-cert-dir=/etc/plrl/webhook"} <= set(c["args"])
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in c["ports"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/plrl/webhook")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert mount["readOnly"] is True and volume["secret"]["secretName"] == secret["metadata"]["name"]
    # Namespaced: only the watched namespaces' jobs are sent to this operator.
    namespaced = next(
        d for d in _template(helm, *NAMESPACED) if d["kind"] == "ValidatingWebhookConfiguration"
    )
    assert namespaced["webhooks"][0]["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]
    }
    # Off: none of it.
    off = _template(helm, "--set", "webhook.enabled=false")
    assert not {"Secret", "ValidatingWebhookConfiguration"} & {d["kind"] for d in off}
    args = next(d for d in off if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert not [a for a in args if a.startswith("--webhook")]


def test_template_namespaced(helm: tools.Tool) -> None:
    all_docs = _template(helm, *NAMESPACED)
    docs = _kinds(all_docs)
    for ns in ("team-a", "team-b"):
        role = docs[("Role", ns)]
        assert any("pipelinerljobs" in r["resources"] for r in role["rules"])
        assert docs[("RoleBinding", ns)]["subjects"][0]["namespace"] == "plrl-system"
        assert ("KopfPeering", ns) in docs
    _check_worker_role(all_docs)
    cluster_role = _cluster_roles(all_docs)[f"{support.SA_NAME}-discovery"]
    assert [r["resources"] for r in cluster_role["rules"]] == [["customresourcedefinitions"], ["nodes"]]
    assert cluster_role["rules"][1]["verbs"] == ["get", "list", "watch"]  # read only
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
    assert can("create", "networkpolicies.networking.k8s.io") == "yes"
    assert can("create", "leases.coordination.k8s.io") == "yes"
    assert can("delete", "statefulsets.apps") == "no"
    assert can("delete", "pipelinerljobs.pipelinerl.io") == "no"
    assert can("delete", "pods") == "yes"  # a hung worker's, to replace it
    assert can("watch", "nodes") == "yes" and can("patch", "nodes") == "no"  # NotReady: read only
    # Secrets: create the job's own and read it back by name; never list or watch them all.
    assert (can("create", "secrets"), can("get", "secrets")) == ("yes", "yes")
    assert (can("list", "secrets"), can("watch", "secrets"), can("patch", "secrets")) == ("no", "no", "no")
    assert can("create", "pods") == "no"
    # RBAC: bind the workers' ClusterRole in a job's namespace; write no role, bind no other.
    assert can("create", "rolebindings.rbac.authorization.k8s.io") == "yes"
    assert can("bind", f"clusterroles.rbac.authorization.k8s.io/{WORKER_ROLE}") == "yes"
    assert can("bind", "clusterroles.rbac.authorization.k8s.io/cluster-admin") == "no"
    assert can("bind", "roles.rbac.authorization.k8s.io") == "no"
    for verb in ("create", "patch", "escalate"):
        assert can(verb, "roles.rbac.authorization.k8s.io") == "no"
        assert can(verb, "clusterroles.rbac.authorization.k8s.io") == "no"
    assert can("create", "validatingwebhookconfigurations.admissionregistration.k8s.io") == "no"
