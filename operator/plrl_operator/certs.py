"""A CA and a serving certificate: for each job's coordinator (its gRPC TLS), and for the admission
webhook of an operator outside the cluster.

`issue(hosts, ca_name)` makes a fresh CA and a serving certificate signed by it, in the layout of a
Kubernetes TLS Secret (`ca.crt`, `tls.crt`, `tls.key`); the CA's private key is dropped at once, so
nobody can sign another certificate under it. `job_tls()` is what the operator puts into each job's
Secret (and `plrl run` into its run directory): generators verify the coordinator against the job's
own CA, under the fixed name `names.TLS_SERVER_NAME`.

For the webhook: in the cluster the chart generates the webhook's certificate (Helm's
genCA/genSignedCert) into a Secret mounted at `settings.webhook_cert_dir`. An operator run by hand
or by the tests, with no such directory, calls `write` once at startup: a fresh CA and a certificate
signed by it for the webhook's host (an IP address or a DNS name), written in the Secret's layout
(`ca.crt`, `tls.crt`, `tls.key`), so the webhook server reads its files the same way in both cases.

Neighbours: `handlers` (configures kopf's webhook server with the files), `settings`.
"""

from __future__ import annotations

import datetime
import ipaddress
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from plrl_api import names

CA_FILE, CERT_FILE, KEY_FILE = names.TLS_CA_KEY, names.TLS_CERT_KEY, names.TLS_KEY_KEY
VALID_DAYS = 365
JOB_VALID_DAYS = 3650
"""A job's certificate outlives any job: the Secret is created once and never rotated."""


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def write(out_dir: pathlib.Path, hosts: list[str]) -> pathlib.Path:
    """Write ca.crt, tls.crt (valid for `hosts`) and tls.key (mode 0600) into `out_dir`."""
    return write_files(out_dir, issue(hosts, "pipelinerl-operator webhook CA"))


def write_files(out_dir: pathlib.Path, files: dict[str, bytes]) -> pathlib.Path:
    """Write `issue`'s files into `out_dir`, the key readable by this user only."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = out_dir / name
        path.touch(mode=0o600 if name == KEY_FILE else 0o644)
        path.write_bytes(content)
    return out_dir


def job_tls(valid_days: int = JOB_VALID_DAYS) -> dict[str, bytes]:
    """A job's own CA and its coordinator's certificate (for `names.TLS_SERVER_NAME`)."""
    return issue([names.TLS_SERVER_NAME], "pipelinerl job CA", valid_days)


def issue(hosts: list[str], ca_common_name: str, valid_days: int = VALID_DAYS) -> dict[str, bytes]:
    """{ca.crt, tls.crt, tls.key}: PEM of a fresh CA and of a serving certificate for `hosts`."""
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=valid_days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_common_name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return {
        CA_FILE: ca.public_bytes(pem),
        CERT_FILE: cert.public_bytes(pem),
        KEY_FILE: key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    }
