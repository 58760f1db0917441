"""gRPC over TLS with the job's own CA (issue 11, finding 6), on loopback: a generator holding the
job's CA talks to the job's coordinator; an impostor coordinator (a certificate from another job's
CA) never receives the token, and a plain-text client gets nowhere."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import grpc
import pytest

from plrl_api import identity
from plrl_operator import certs
from plrl_workers import protocol
from plrl_workers.coordinator import core as coordinator
from plrl_workers.rpc import client, server

TOKEN = "s3cret-job-token"


def _coord() -> coordinator.Coordinator:
    prompts = (protocol.Prompt(i, f"{i}+1=?", str(i + 1), (7, i)) for i in range(10))
    return coordinator.Coordinator(prompts, coordinator.Config(samples_per_prompt=1))


def _tls(files: dict[str, bytes]) -> identity.TLSFiles:
    return identity.TLSFiles(files[certs.CA_FILE], files[certs.CERT_FILE], files[certs.KEY_FILE])


@pytest.fixture(scope="module")
def job() -> identity.TLSFiles:
    return _tls(certs.job_tls())


@pytest.fixture
def coord() -> coordinator.Coordinator:
    return _coord()


@pytest.fixture
def srv(coord: coordinator.Coordinator, job: identity.TLSFiles) -> Iterator[server.Server]:
    s = server.serve(coord, token=TOKEN, host="127.0.0.1", port=0, tls=(job.key, job.cert))
    yield s
    s.stop(0)


def test_a_generator_with_the_jobs_ca_is_served(srv: server.Server, job: identity.TLSFiles) -> None:
    with client.CoordinatorClient(f"127.0.0.1:{srv.port}", TOKEN, tls_ca=job.ca, timeout_s=10) as c:
        c.register("gen-0")
        assert len(c.lease_prompts("gen-0", 2).leases) == 2


def test_an_impostor_coordinator_never_receives_the_token(job: identity.TLSFiles) -> None:
    other = _tls(certs.job_tls())  # another job's CA signed the impostor's certificate
    impostor = _coord()
    srv = server.serve(impostor, token=TOKEN, host="127.0.0.1", port=0, tls=(other.key, other.cert))
    try:
        with (
            client.CoordinatorClient(f"127.0.0.1:{srv.port}", TOKEN, tls_ca=job.ca, timeout_s=5) as c,
            pytest.raises(grpc.RpcError) as refused,
        ):
            c.register("gen-0", ready_timeout_s=2)
        assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        stats = impostor.stats()
        assert stats.generators == 0 and stats.refused == {}  # no call, so no token, ever reached it
    finally:
        srv.stop(0)


def test_a_plain_text_client_gets_nowhere(srv: server.Server, coord: coordinator.Coordinator) -> None:
    with (
        client.CoordinatorClient(f"127.0.0.1:{srv.port}", TOKEN, timeout_s=5) as c,
        pytest.raises(grpc.RpcError),
    ):
        c.register("gen-0", ready_timeout_s=2)
    assert coord.stats().generators == 0


def test_the_jobs_files_read_back_from_its_secret_directory(tmp_path: pathlib.Path) -> None:
    d = tmp_path
    assert identity.read_tls(d) is None  # a Secret without TLS files: plain text
    files = certs.job_tls()
    certs.write_files(d, files)
    tls = identity.read_tls(d)
    assert tls == _tls(files)
    assert (d / certs.KEY_FILE).stat().st_mode & 0o777 == 0o600
    (d / certs.KEY_FILE).unlink()
    with pytest.raises(identity.IdentityError, match="not all TLS files"):
        identity.read_tls(d)
