"""The admission webhook's pure parts: the verdict, the certificate outside the cluster, the settings.

Cases: a valid job is allowed and an invalid one refused with exactly `plrl run`'s lines; an update
that leaves `spec` alone is allowed even for a job that no longer validates (ratcheting), one that
changes it is checked; the generated certificate is signed by the generated CA, is valid for the
webhook's host (IP or DNS name) and its key is private to the user; the webhook settings come
from the environment and refuse combinations that cannot serve.
"""

from __future__ import annotations

import copy
import ipaddress
import pathlib
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from plrl_api import spec
from plrl_operator import admission, certs, jobfile, settings
from tests.operator.cluster import corpus


def _job() -> dict[str, Any]:
    doc: dict[str, Any] = jobfile.parse_yaml(corpus.BASE_FILE.read_bytes(), "base")
    doc["metadata"].update(
        namespace="ns", uid="u", resourceVersion="1", managedFields=[{"manager": "kubectl"}]
    )
    return doc


def test_a_valid_job_is_allowed() -> None:
    assert admission.review("CREATE", _job(), None) == []


def test_an_invalid_job_is_refused_with_plrl_runs_lines() -> None:
    bad = _job()
    bad["spec"]["training"]["tokensPerMicroBatch"] = 16
    with pytest.raises(spec.JobFileError) as exc:
        spec.parse_job(bad)
    assert admission.review("CREATE", bad, None) == str(exc.value).splitlines()
    assert admission.review("CREATE", bad, None)[0].startswith("spec.training.tokensPerMicroBatch: ")


def test_updates_are_checked_only_when_the_spec_changes() -> None:
    stored = _job()
    stored["spec"]["training"]["tokensPerMicroBatch"] = 16  # stored before a rule existed
    relabelled = copy.deepcopy(stored)
    relabelled["metadata"]["labels"] = {"team": "a"}
    relabelled["metadata"]["finalizers"] = ["pipelinerl.io/finalizer"]
    assert admission.review("UPDATE", relabelled, stored) == []
    edited = copy.deepcopy(stored)
    edited["spec"]["training"]["totalSteps"] = 10
    assert admission.review("UPDATE", edited, stored) != []
    fixed = copy.deepcopy(stored)
    fixed["spec"]["training"]["tokensPerMicroBatch"] = 512
    assert admission.review("UPDATE", fixed, stored) == []


@pytest.mark.parametrize("host", ["127.0.0.1", "operator.example.com"])
def test_the_generated_certificate_is_for_the_host_and_signed_by_the_ca(
    tmp_path: pathlib.Path, host: str
) -> None:
    out = certs.write(tmp_path / "tls", [host])
    ca = x509.load_pem_x509_certificate((out / certs.CA_FILE).read_bytes())
    cert = x509.load_pem_x509_certificate((out / certs.CERT_FILE).read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    if host[0].isdigit():
        assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address(host)]
    else:
        assert names.get_values_for_type(x509.DNSName) == [host]
    key = serialization.load_pem_private_key((out / certs.KEY_FILE).read_bytes(), None)
    assert key.public_key() == cert.public_key()
    assert (out / certs.KEY_FILE).stat().st_mode & 0o077 == 0


def test_webhook_settings() -> None:
    env = {"PLRL_WEBHOOK_PORT": "9443", "PLRL_WEBHOOK_CERT_DIR": "/etc/plrl/webhook"}
    c = settings.from_env(env)
    assert (c.webhook_port, c.webhook_cert_dir, c.webhook_host, c.webhook_addr) == (
        9443,
        "/etc/plrl/webhook",
        None,
        "0.0.0.0",
    )
    assert settings.check(c) is None
    assert settings.check(settings.OperatorConfig()) is None  # no webhook at all
    assert "certificate" in str(settings.check(settings.OperatorConfig(webhook_port=9443)))
    assert "--webhook-port" in str(settings.check(settings.OperatorConfig(webhook_host="127.0.0.1")))
    dev = settings.from_env({"PLRL_WEBHOOK_PORT": "1", "PLRL_WEBHOOK_HOST": "127.0.0.1"})
    assert settings.check(dev) is None and dev.webhook_configuration == "pipelinerl-operator.pipelinerl.io"
