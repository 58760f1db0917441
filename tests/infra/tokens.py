"""Acting as a ServiceAccount: a token from the TokenRequest API, and a kubeconfig that carries only
that token (no client certificate, which the API server would authenticate first).

Used to prove RBAC: run kubectl or an operator with `token_kubeconfig(...)` and it gets exactly the
ServiceAccount's permissions. Neighbours: controlplane.py (writes the admin kubeconfig read here).
"""

from __future__ import annotations

import pathlib

import yaml
from kubernetes import client


def service_account_token(core: client.CoreV1Api, namespace: str, name: str, *, seconds: int = 3600) -> str:
    """A bound token for namespace/name  with the API server's
    default audience, as a projected token volume in a pod would get."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
    )
    status = core.create_namespaced_service_account_token(name, namespace, request).status
    if status is None:
        raise RuntimeError(f"TokenRequest for {namespace}/{name} returned no status")
    return str(status.token)


def token_kubeconfig(
    admin_kubeconfig: pathlib.Path, token: str, path: pathlib.Path, *, namespace: str = ""
) -> pathlib.Path:
    """Writes a kubeconfig for the same cluster as admin_kubeconfig that authenticates with `token`."""
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context: dict[str, str] = {"cluster": "plrl", "user": "token"}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "plrl", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "token", "user": {"token": token}}],
        "contexts": [{"name": "plrl", "context": context}],
        "current-context": "plrl",
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path
