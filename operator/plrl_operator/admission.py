"""The admission webhook's verdict on a PipelineRLJob: the same models and messages as `plrl run`.

`handlers.py` registers `review` as kopf's validating handler for PipelineRLJob creates and
updates. The API server calls it after its own schema and CEL validation, on the object as it
would store it (defaults filled in), so every rule of `plrl_api.spec` is enforced at `kubectl
apply` time even where the CRD could not express it, and the refusal reads exactly like
`plrl run`'s (`spec.<field>: <message>`, one line per problem).

Updates that leave `spec` unchanged are allowed without a check (the operator's own metadata
writes, finalizers, labels): like the API server's validation ratcheting, an object is never
locked by a rule added after it was stored.

Pure: no kopf, no I/O. Neighbours: `plrl_api.spec` (the rules), `handlers` (the kopf wiring),
`certs` (the webhook server's TLS certificate), `metrics` (reviews counted by verdict).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plrl_api import spec as spec_mod

# The handler id: kopf serves it at https://<host>:<port>/<id>; the chart's webhook path names it.
HANDLER_ID = "validate-job"
OPERATIONS = ("CREATE", "UPDATE")


def review(operation: str | None, new: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> list[str]:
    """The problems with `new` (one line each, field path first); empty: allow."""
    if new is None:
        return []
    if operation == "UPDATE" and old is not None and old.get("spec") == new.get("spec"):
        return []
    meta = new.get("metadata") or {}
    doc = {
        "apiVersion": new.get("apiVersion"),
        "kind": new.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "namespace") if meta.get(k) is not None},
        "spec": new.get("spec"),
    }
    try:
        spec_mod.parse_job(doc)
    except spec_mod.JobFileError as err:
        return str(err).splitlines()
    return []
