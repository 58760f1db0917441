"""One verdict everywhere: the invalid-job corpus through the API server, the webhook and `plrl`.

Every case of `corpus.CORPUS` (one fault each on the demo job; the issue's bad files among them)
goes through
1. `kubectl apply` against the real API server, with the chart's CRD (OpenAPI + CEL) and the
   operator's admission webhook registered (the operator runs as a local process with
   `--webhook-host`, so it registers its own ValidatingWebhookConfiguration);
2. the webhook itself, sent the parsed job as an AdmissionReview (it would refuse each job even
   if the CRD did not);
3. `plrl render` and `plrl run` (in-process; the issue's files also as processes, in bounded time
   and memory, and none leaves a run directory or starts a worker).
A spec-level case passes when all of them refuse and name the same set of fields (the CEL rules
word for word as `plrl` and the webhook); a file-level case when both refuse and say where.

Also here: the valid base jobs are accepted through the webhook; the webhook fails closed when
the operator dies (and works again when it is back); an operator started the chart's way serves
the chart's certificate (the Secret's files) for the Service's DNS name.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import json
import pathlib
import re
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from plrl_operator import jobfile, render_cli
from plrl_operator.local import runner
from tests.infra import binaries, controlplane, kube, procs, tokens, tools
from tests.operator.cluster import corpus, support

pytestmark = pytest.mark.cluster

WEBHOOK_CONFIG = "pipelinerl-operator.pipelinerl.io"  # settings.OperatorConfig().webhook_configuration
MANAGER_ROLE = "plrl-test-webhook-manager"
PLRL_TIMEOUT_S = 10.0  # a refusal takes ~1.5 s here, most of it Python start-up
PLRL_MAX_RSS_MB = 100  # ~38 MB measured for each of them, as for a valid job

_API_FIELD = re.compile(r"(?:^|\* |is invalid: )((?:spec|metadata)(?:\.[A-Za-z0-9]+|\[\d+\])*): ", re.M)
_UNKNOWN_FIELD = re.compile(r'unknown field "((?:spec|metadata)[^"]*)"')


def _api_fields(text: str) -> set[str]:
    return set(_API_FIELD.findall(text)) | set(_UNKNOWN_FIELD.findall(text))


def _plrl_lines(err: str) -> list[str]:
    """The problems `plrl` printed: the lines after `plrl <verb>: FILE: invalid PipelineRLJob:`,
    or its one line (without `plrl <verb>: `) for a file that is no job at all."""
    lines = err.strip().splitlines()
    if lines and lines[0].endswith("invalid PipelineRLJob:"):
        return lines[1:]
    return [re.sub(r"^plrl \w+: ", "", line) for line in lines]


def _plrl_fields(lines: list[str]) -> set[str]:
    return {re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", line.split(": ", 1)[0]) for line in lines}


# --------------------------------------------------------------------------- fixtures


@dataclasses.dataclass
class Webhook:
    """The operator serving the webhook, and how to reach it as the API server does."""

    operator: support.Operator
    kubectl: tools.Tool
    port: int
    ca: bytes = b""

    def refresh(self) -> None:
        """Wait until the operator's webhook configuration points here, and read its CA."""

        def current() -> bytes | None:
            out = self.kubectl(
                "get", "validatingwebhookconfiguration", WEBHOOK_CONFIG, "-o", "json", check=False
            )
            if out.returncode != 0:
                return None
            hooks = json.loads(out.stdout).get("webhooks") or []
            if not hooks or f":{self.port}/" not in hooks[0]["clientConfig"].get("url", ""):
                return None
            return base64.b64decode(hooks[0]["clientConfig"]["caBundle"])

        self.ca = support.eventually(current, 60, "the operator's ValidatingWebhookConfiguration")

    def review(self, doc: dict[str, Any], server_name: str = "127.0.0.1") -> tuple[bool, str]:
        """Send `doc` as the API server would, checking the certificate is valid for `server_name`;
        (allowed, message)."""
        request = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "pipelinerl.io", "version": "v1alpha1", "kind": "PipelineRLJob"},
                "resource": {"group": "pipelinerl.io", "version": "v1alpha1", "resource": "pipelinerljobs"},
                "operation": "CREATE",
                "userInfo": {"username": "test"},
                "object": doc,
                "dryRun": True,
            },
        }
        reply = _https_post("127.0.0.1", self.port, "/validate-job", request, self.ca, server_name)
        response = reply["response"]
        return bool(response["allowed"]), str(response.get("status", {}).get("message", ""))


def _https_post(
    addr: str, port: int, path: str, body: dict[str, Any], ca: bytes, server_name: str
) -> dict[str, Any]:
    """POST JSON over TLS to addr:port, verifying the certificate for `server_name` against `ca`."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    data = json.dumps(body).encode()
    with (
        socket.create_connection((addr, port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=server_name) as s,
    ):
        head = f"POST {path} HTTP/1.1\r\nHost: {server_name}\r\nContent-Type: application/json\r\n"
        s.sendall(f"{head}Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    status, _, rest = reply.partition(b"\r\n")
    assert b" 200 " in status + b" ", status
    payload: dict[str, Any] = json.loads(rest.partition(b"\r\n\r\n")[2])
    return payload


def _manager_rbac(namespace: str, service_account: str) -> str:
    """What an operator outside the cluster needs beyond the chart's RBAC to register its webhook
    (kopf creates and patches both configuration kinds; the chart's mode needs neither)."""
    docs = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": MANAGER_ROLE},
            "rules": [
                {
                    "apiGroups": ["admissionregistration.k8s.io"],
                    "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
                    "verbs": ["create", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": MANAGER_ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": MANAGER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    ]
    return "\n---\n".join(support.dump(d) for d in docs)


@pytest.fixture(scope="module")
def admin(control_plane: controlplane.Cluster) -> tools.Tool:
    return tools.bind(binaries.kubectl(), control_plane.kubeconfig)


@pytest.fixture(scope="module")
def sa_kubeconfig(
    chart: support.Chart,
    control_plane: controlplane.Cluster,
    core_api: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> pathlib.Path:
    token = tokens.service_account_token(client.CoreV1Api(core_api), chart.namespace, chart.service_account)
    path = tmp_path_factory.mktemp("webhook") / "operator.kubeconfig"
    return tokens.token_kubeconfig(control_plane.kubeconfig, token, path)


@pytest.fixture(scope="module")
def webhook(
    chart: support.Chart,
    admin: tools.Tool,
    sa_kubeconfig: pathlib.Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Webhook]:
    admin("apply", "-f", "-", input=_manager_rbac(chart.namespace, chart.service_account))
    port = procs.free_port()
    op = support.Operator(
        sa_kubeconfig,
        tmp_path_factory.mktemp("webhook-operator"),
        f"--webhook-port={port}",
        "--webhook-addr=127.0.0.1",
        "--webhook-host=127.0.0.1",
        name="webhook-operator",
    )
    op.start()
    hook = Webhook(op, admin, port)
    try:
        hook.refresh()
        yield hook
    finally:
        op.stop()  # kopf empties its webhook configuration on a clean exit
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            admin("delete", kind, WEBHOOK_CONFIG, "--ignore-not-found", check=False)
        admin("delete", "clusterrolebinding,clusterrole", MANAGER_ROLE, "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def namespace_(core_api: client.ApiClient) -> Iterator[str]:
    """One namespace for the whole corpus (nothing is ever created in it)."""
    name = f"t-valid-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(core_api)
    core.create_namespace(kube.model(client.V1Namespace, {"metadata": {"name": name}}))
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[pathlib.Path, pathlib.Path]]:
    out = tmp_path_factory.mktemp("corpus")
    return {case.id: case.write(out) for case in corpus.CORPUS}


def _accepted(admin: tools.Tool, namespace: str, path: pathlib.Path | None = None, doc: str = "") -> bool:
    args = ["apply", "-n", namespace, "--dry-run=server", "-f", str(path) if path else "-"]
    out = admin(*args, input=doc or None, check=False)
    return out.returncode == 0 and "created (server dry run)" in out.stdout


# --------------------------------------------------------------------------- the corpus


def test_the_corpus_covers_the_issue() -> None:
    assert len(corpus.CORPUS) >= 30 and len({c.id for c in corpus.CORPUS}) == len(corpus.CORPUS)
    assert len(corpus.ISSUE) == 13  # every bad file the issue names


@pytest.mark.parametrize("case", corpus.CORPUS, ids=[c.id for c in corpus.CORPUS])
def test_the_api_server_the_webhook_and_plrl_give_one_verdict(
    case: corpus.Case,
    files: dict[str, tuple[pathlib.Path, pathlib.Path]],
    webhook: Webhook,
    admin: tools.Tool,
    namespace_: str,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, api_path = files[case.id]
    capsys.readouterr()
    # 1. kubectl apply: refused, nothing stored.
    api = admin("apply", "-n", namespace_, "-f", str(api_path), check=False)
    assert api.returncode != 0, f"the API server accepted {case.id}: {api.stdout}"
    names = admin("get", "plrljobs", "-n", namespace_, "-o", "name").stdout
    assert names.strip() == "", names
    # 2. plrl render, then plrl run: exit 2, the same lines, no run directory.
    assert render_cli.main([str(path)]) == 2
    render_err = capsys.readouterr().err
    run_dir = tmp_path / "run"
    assert runner.main([str(path), "--run-dir", str(run_dir)]) == 2
    run_err = capsys.readouterr().err
    assert not run_dir.exists(), "plrl run left a run directory behind"
    lines = _plrl_lines(render_err)
    assert lines == _plrl_lines(run_err) and "Traceback" not in render_err + run_err
    if case.field is None:  # file-level: refused before any field exists, saying where
        assert len(lines) == 1 and case.plrl in lines[0] and str(path) in lines[0], render_err
        assert case.api in api.stderr, api.stderr
        return
    assert case.field in _plrl_fields(lines), lines
    if case.api:  # a value JSON cannot carry: kubectl refuses it before the server sees it
        assert case.api in api.stderr, api.stderr
        return
    assert _api_fields(api.stderr) == _plrl_fields(lines) | set(case.api_also), (api.stderr, lines)
    if case.rule:  # one Rule, one message: the CEL messageExpression prints plrl's words
        for line in lines:
            field, message = line.split(": ", 1)
            assert f"{field}: Invalid value: {message}" in api.stderr, (line, api.stderr)
    # 3. the webhook: the same lines as plrl, for the job as kubectl would send it.
    doc = jobfile.parse_yaml(path.read_bytes(), str(path))
    if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
        doc["metadata"]["namespace"] = namespace_
    allowed, message = webhook.review(doc)
    assert not allowed and message.splitlines() == lines, message


# Runs argv[2:] and writes its exit code and peak RSS (KiB) to argv[1]. A process forked from
# pytest would inherit pytest's high-water RSS (Linux keeps ru_maxrss across exec); forked from
# this small launcher it starts from a few MB.
_MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def _plrl_process(verb: str, path: pathlib.Path, work: pathlib.Path) -> tuple[int, float, float, str]:
    """`plrl <verb> <path>` as a process: (exit code, seconds, peak RSS in MB, stderr)."""
    err_path, measured = work / f"{path.stem}.{verb}.err", work / f"{path.stem}.{verb}.rusage"
    argv = [sys.executable, "-c", _MEASURE, str(measured), sys.executable, "-m", "plrl_operator.cli"]
    argv += [verb, str(path)]
    if verb == "run":
        argv += ["--run-dir", str(work / f"{path.stem}.run")]
    started = time.monotonic()
    with err_path.open("wb") as err:
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=err, cwd=support.ROOT, timeout=60, check=True)
    seconds = time.monotonic() - started
    code, rss_kib = (int(v) for v in measured.read_text().split())
    return code, seconds, rss_kib / 1024, err_path.read_text()


def test_the_issue_files_are_refused_by_plrl_processes_in_bounded_time_and_memory(
    files: dict[str, tuple[pathlib.Path, pathlib.Path]], tmp_path: pathlib.Path
) -> None:
    """`plrl run` for every file of the issue (the verb that used to start processes, hang or
    crash), `plrl render` too for the file-level ones (the alias bomb exhausted its memory)."""
    jobs = [("run", c) for c in corpus.ISSUE] + [("render", c) for c in corpus.ISSUE if c.field is None]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda j: _plrl_process(j[0], files[j[1].id][0], tmp_path), jobs))
    for (verb, case), (code, seconds, rss_mb, err) in zip(jobs, results, strict=True):
        what = f"plrl {verb} {case.id}"
        assert code == 2 and "Traceback" not in err, f"{what} exited {code}:\n{err}"
        assert seconds < PLRL_TIMEOUT_S and rss_mb < PLRL_MAX_RSS_MB, (what, seconds, rss_mb)
        assert (case.field or case.plrl) in err, (what, err)
        assert not (tmp_path / f"{case.id}.run").exists(), f"{what} left a run directory"


# --------------------------------------------------------------------------- the webhook


def test_the_valid_base_jobs_are_accepted_through_the_webhook(
    webhook: Webhook, admin: tools.Tool, namespace_: str
) -> None:
    """The corpus differs from accepted jobs only by its faults; the webhook saw them pass."""
    before = webhook.operator.total("plrl_operator_admission_reviews_total", allowed="true")
    assert _accepted(admin, namespace_, corpus.BASE_FILE)
    assert _accepted(admin, namespace_, doc=support.dump(support.small_job("ok")))
    support.eventually(
        lambda: webhook.operator.total("plrl_operator_admission_reviews_total", allowed="true") >= before + 2,
        10,
        "the webhook's count of allowed reviews",
    )
    base = jobfile.parse_yaml(corpus.BASE_FILE.read_bytes(), "base")
    assert webhook.review(base) == (True, "")


def test_the_webhook_fails_closed_while_the_operator_is_down(
    webhook: Webhook, admin: tools.Tool, namespace_: str
) -> None:
    proc = webhook.operator.proc
    assert proc is not None
    proc.kill()  # no clean exit: the webhook configuration stays, nobody answers it
    proc.wait(timeout=30)
    try:
        out = admin("apply", "-n", namespace_, "--dry-run=server", "-f", str(corpus.BASE_FILE), check=False)
        assert out.returncode != 0 and "failed calling webhook" in out.stderr, out.stdout + out.stderr
    finally:
        webhook.operator.start()
        webhook.refresh()
    support.eventually(lambda: _accepted(admin, namespace_, corpus.BASE_FILE), 60, "the webhook back")


def test_an_operator_started_the_charts_way_serves_the_charts_certificate(
    chart: support.Chart, sa_kubeconfig: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """The chart's Secret (its files, as the Deployment mounts them) is what the operator serves,
    valid for the webhook Service's DNS name under the CA in the chart's webhook configuration."""
    rendered = chart.helm(
        "template",
        support.RELEASE,
        str(support.CHART),
        "--namespace",
        support.RELEASE_NS,
        "--kube-version=1.37.0",
    ).stdout
    docs = {d["kind"]: d for d in yaml.safe_load_all(rendered) if d}
    secret, vwc = docs["Secret"], docs["ValidatingWebhookConfiguration"]
    hook = vwc["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    certs = tmp_path / "webhook"
    certs.mkdir()
    for name, value in secret["data"].items():
        (certs / name).write_bytes(base64.b64decode(value))
    service = hook["clientConfig"]["service"]
    port = procs.free_port()
    op = support.Operator(
        sa_kubeconfig,
        tmp_path,
        "--standalone",
        f"--webhook-port={port}",
        "--webhook-addr=127.0.0.1",
        f"--webhook-cert-dir={certs}",
        name="chart-mode",
    )
    op.start()
    try:
        ca = base64.b64decode(hook["clientConfig"]["caBundle"])
        dns = f"{service['name']}.{service['namespace']}.svc"
        good = jobfile.parse_yaml(corpus.BASE_FILE.read_bytes(), "base")
        bad = json.loads(json.dumps(good))
        bad["spec"]["training"]["tokensPerMicroBatch"] = 16

        def verdict(doc: dict[str, Any]) -> bool | None:
            try:
                return Webhook(op, chart.helm, port, ca).review(doc, server_name=dns)[0]
            except OSError:
                return None  # not listening yet (kopf starts the server once it has scanned the CRDs)

        support.eventually(lambda: verdict(good) is True, 60, "the chart-mode webhook")
        assert verdict(bad) is False
    finally:
        op.stop()
