"""Worker heartbeats against the real control plane, renewed as the job's worker ServiceAccount.

Cases: the operator-rendered worker configs (from the job's ConfigMap) and a TokenRequest token of
`<job>-worker` are all that trainer-0's and two generators' heartbeats need, so the chart's worker
ClusterRole, bound by the rendered RoleBinding, suffices (server-side apply creates, then renews,
each Lease `<job>-<pod>`); trainer-0 finds its
credentials the way a pod does (mounted token and CA, KUBERNETES_SERVICE_* env), the generators
through a kubeconfig; `kubectl get plrljobs`
then shows STEP, LAG, REWARD and TOK/S from trainer-0's metrics row and follows it as it changes;
the Leases carry every worker's numbers; WorkersHealthy goes Unknown -> True, then False naming the
pod (plus a HeartbeatTimeout event) once one generator stops renewing; trainer-0 reporting
`finished` makes the job Succeeded; deleting the job deletes its Leases (they are owned by it).
A ServiceAccount without that binding is refused (403): logged, retried, never raised to the worker.
"""

from __future__ import annotations

import base64
import json
import logging
import pathlib
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kubernetes import client

from plrl_api import identity, names, plan, records, worker_config
from plrl_api import spec as spec_mod
from plrl_operator.render import config as render_config
from plrl_workers import heartbeat
from tests import samples
from tests.infra import controlplane, nodes, tokens, tools
from tests.operator.cluster import support
from tests.operator.cluster.support import eventually

pytestmark = pytest.mark.cluster
ROW = samples.step_record()  # what trainer.Coordination.log_step writes


def _pod(namespace: str, pod: str) -> identity.Identity:
    """The identity a worker pod's env gives it (downward API)."""
    return identity.Identity(token="t", pod_name=pod, namespace=namespace)


def _get(kubectl: tools.Tool, *args: str) -> dict[str, Any]:
    out = kubectl("get", *args, "-o", "json", check=False)
    return dict(json.loads(out.stdout)) if out.returncode == 0 else {}


def _condition(kubectl: tools.Tool, ns: str, job: str, ctype: str) -> dict[str, Any]:
    conds = _get(kubectl, "plrljob", job, "-n", ns).get("status", {}).get("conditions", [])
    return next((dict(c) for c in conds if c["type"] == ctype), {})


def _wait_healthy(kubectl: tools.Tool, ns: str, state: str) -> dict[str, Any]:
    """Job hb's WorkersHealthy condition once its status is `state`."""
    cond: dict[str, Any] = eventually(
        lambda: (c := _condition(kubectl, ns, "hb", "WorkersHealthy")).get("status") == state and c,
        30,
        f"WorkersHealthy={state}",
    )
    return cond


def _worker_kubeconfig(
    core_api: client.ApiClient, control_plane: controlplane.Cluster, ns: str, sa: str, path: pathlib.Path
) -> pathlib.Path:
    token = tokens.service_account_token(client.CoreV1Api(core_api), ns, sa)
    return tokens.token_kubeconfig(control_plane.kubeconfig, token, path, namespace=ns)


def _pod_mount(
    core_api: client.ApiClient, control_plane: controlplane.Cluster, ns: str, sa: str, path: pathlib.Path
) -> tuple[pathlib.Path, dict[str, str]]:
    """What kubelet gives a pod of ServiceAccount `sa`: the token, CA and namespace files, and the env."""
    token = tokens.service_account_token(client.CoreV1Api(core_api), ns, sa)
    cluster = yaml.safe_load(control_plane.kubeconfig.read_text())["clusters"][0]["cluster"]
    path.mkdir()
    (path / "token").write_text(token)
    (path / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    (path / "namespace").write_text(ns)
    server = urllib.parse.urlsplit(cluster["server"])
    return path, {
        "KUBERNETES_SERVICE_HOST": str(server.hostname),
        "KUBERNETES_SERVICE_PORT": str(server.port),
    }


def test_heartbeats_drive_the_job_status(
    operator: support.Operator,
    kubectl: tools.Tool,
    namespace: str,
    gpu_nodes: Callable[..., nodes.Pool],
    core_api: client.ApiClient,
    control_plane: controlplane.Cluster,
    tmp_path: pathlib.Path,
) -> None:
    pool = gpu_nodes(1)
    doc = support.small_job(
        "hb",
        resources={"nodeSelector": {nodes.POOL_LABEL: pool.name}},
        heartbeat={"intervalSeconds": 0.5, "timeoutSeconds": 3},
    )
    kubectl("apply", "-n", namespace, "-f", "-", input=support.dump(doc))
    eventually(
        lambda: _get(kubectl, "plrljob", "hb", "-n", namespace).get("status", {}).get("ready") == "3/3",
        60,
        "hb Running with 3/3 pods",
    )
    assert _condition(kubectl, namespace, "hb", "WorkersHealthy")["reason"] == "NoHeartbeats"

    # What a worker pod has: its role's file from the ConfigMap, its pod name, the worker SA's token.
    files = _get(kubectl, "configmap", "hb-config", "-n", namespace)["data"]
    cfgs = {
        role: worker_config.WorkerConfig.model_validate_json(files[f"{role}.json"]) for role in names.ROLES
    }
    kubeconfig = _worker_kubeconfig(
        core_api, control_plane, namespace, "hb-worker", tmp_path / "worker.kubeconfig"
    )

    sa_dir, service_env = _pod_mount(core_api, control_plane, namespace, "hb-worker", tmp_path / "sa")

    trainer: dict[str, Any] = {"row": ROW, "finished": False}

    def trainer_report() -> records.WorkerReport:
        row: records.StepRecord = trainer["row"]
        return heartbeat.trainer_report(
            row,
            step=row.step,
            weight_version=row.version,
            finished=bool(trainer["finished"]),
            tokens_per_second=990.0,
            queue_depth=3,
        )

    def generator_report(i: int) -> Callable[[], records.WorkerReport]:
        return lambda: heartbeat.generator_report(
            weight_version=12, tokens_per_second=400.0 + i, in_flight=48, capacity=64, queue_depth=i
        )

    beats = [
        heartbeat.start(
            cfgs["trainer"], _pod(namespace, "hb-train-0"), trainer_report, env=service_env, sa_dir=sa_dir
        ),
        *(
            heartbeat.start(
                cfgs["generator"],
                _pod(namespace, f"hb-gen-{i}"),
                generator_report(i),
                env={"KUBECONFIG": str(kubeconfig)},
            )
            for i in (0, 1)
        ),
    ]
    try:
        assert all(b is not None for b in beats)

        def status_step(step: int) -> Callable[[], bool]:
            return lambda: (
                _get(kubectl, "plrljob", "hb", "-n", namespace).get("status", {}).get("step") == step
            )

        eventually(status_step(12), 30, "STEP 12 from trainer-0's Lease")
        table = kubectl("get", "plrljobs", "-n", namespace).stdout.splitlines()
        assert table[0].split()[:8] == ["NAME", "PHASE", "GEN", "TRAIN", "STEP", "LAG", "REWARD", "TOK/S"]
        assert table[1].split()[:8] == ["hb", "Running", "2", "2", "12", "1.25", "0.375", "1000"]
        wide = kubectl("get", "plrljob", "hb", "-n", namespace, "-o", "wide").stdout.splitlines()
        header = wide[0].split()
        values = dict(zip(header, wide[1].split(), strict=False))
        assert (values["WEIGHTS"], values["GEN-TOK/S"]) == ("12", "800")
        s = _get(kubectl, "plrljob", "hb", "-n", namespace)["status"]
        assert s["lag"] == {"mean": 1.25, "max": 3}
        assert s["throughput"] == {
            "generatedTokensPerSecond": 800.0,
            "trainedTokensPerSecond": 1000.0,
            "ratio": 1.25,
        }

        trainer["row"] = ROW.model_copy(
            update={"step": 13, "version": 13, "reward_mean": 0.5, "lag_mean": 0.75, "lag_max": 2}
        )
        eventually(status_step(13), 30, "STEP follows trainer-0's next row")
        row = kubectl("get", "plrljobs", "-n", namespace).stdout.splitlines()[1].split()
        assert row[4:8] == ["13", "0.75", "0.5", "1000"]

        healthy = _wait_healthy(kubectl, namespace, "True")
        assert healthy["message"] == "3 workers renewed their Lease within 3s"

        lease = _get(kubectl, "lease", "hb-hb-gen-1", "-n", namespace, "--show-managed-fields")
        assert lease["spec"]["holderIdentity"] == "hb-gen-1"
        assert lease["spec"]["leaseDurationSeconds"] == 3
        assert lease["metadata"]["labels"] == {"pipelinerl.io/job": "hb", "pipelinerl.io/role": "generator"}
        assert lease["metadata"]["annotations"] == {
            "pipelinerl.io/role": "generator",
            "pipelinerl.io/weight-version": "12",
            "pipelinerl.io/tokens-per-second": "401.0",
            "pipelinerl.io/queue-depth": "1",
            "pipelinerl.io/utilisation": "0.750",
        }
        owner = lease["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == (spec_mod.KIND, "hb")
        assert {f["manager"] for f in lease["metadata"]["managedFields"]} == {heartbeat.FIELD_MANAGER}
        train_ann = _get(kubectl, "lease", "hb-hb-train-0", "-n", namespace)["metadata"]["annotations"]
        assert json.loads(train_ann["pipelinerl.io/progress"])["step"] == 13
        assert train_ann["pipelinerl.io/utilisation"] == "0.750"

        # generator 1 goes silent: past the 3 s timeout the job says so, naming the pod.
        silent = beats[2]
        assert silent is not None
        silent.stop(final=False)
        silent_msg = (
            "1/3 workers silent for more than spec.heartbeat.timeoutSeconds=3: hb-gen-1 (last renewed "
        )
        stale = eventually(
            lambda: (
                (c := _condition(kubectl, namespace, "hb", "WorkersHealthy"))
                .get("message", "")
                .startswith(silent_msg)
                and c
            ),
            30,
            "WorkersHealthy naming hb-gen-1 (and only it) as silent",
        )
        assert stale["status"] == "False" and stale["reason"] == "HeartbeatTimeout"
        describe = eventually(
            lambda: (
                (d := kubectl("describe", "plrljob", "hb", "-n", namespace).stdout)
                and "HeartbeatTimeout" in d
            ),
            30,
            "the HeartbeatTimeout event",
        )
        assert describe

        # trainer-0 finishes its last step: the job has succeeded.
        trainer["row"] = ROW.model_copy(update={"step": 20, "version": 20})
        trainer["finished"] = True
        eventually(
            lambda: (
                _get(kubectl, "plrljob", "hb", "-n", namespace).get("status", {}).get("phase") == "Succeeded"
            ),
            30,
            "hb Succeeded",
        )
        assert _get(kubectl, "plrljob", "hb", "-n", namespace)["status"]["step"] == 20
    finally:
        for b in beats:
            if b is not None:
                b.stop(final=False)

    kubectl("delete", "plrljob", "hb", "-n", namespace, "--wait=false")
    eventually(
        lambda: not _get(kubectl, "leases", "-n", namespace, "-l", "pipelinerl.io/job=hb").get("items", [1]),
        60,
        "the job's Leases garbage-collected with it",
    )


def test_a_refused_renewal_is_logged_and_retried(
    kubectl: tools.Tool,
    namespace: str,
    core_api: client.ApiClient,
    control_plane: controlplane.Cluster,
    tmp_path: pathlib.Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    doc = support.small_job("nobody", heartbeat={"intervalSeconds": 0.2, "timeoutSeconds": 1})
    job = spec_mod.parse_job({**doc, "metadata": {"name": "nobody", "namespace": namespace}})
    cm = render_config.config_map(job, plan.PodPlan.of(job.spec, 2))
    cfg = worker_config.WorkerConfig.model_validate_json(cm["data"]["generator.json"])
    # The namespace's `default` ServiceAccount: authenticated, but no binding lets it touch Leases.
    eventually(lambda: _get(kubectl, "serviceaccount", "default", "-n", namespace), 30, "the default SA")
    kubeconfig = _worker_kubeconfig(
        core_api, control_plane, namespace, "default", tmp_path / "default.kubeconfig"
    )
    calls: list[float] = []

    def report() -> records.WorkerReport:
        calls.append(time.monotonic())
        return records.WorkerReport(role="generator", weight_version=len(calls))

    with caplog.at_level(logging.WARNING, "plrl.heartbeat"):
        beat = heartbeat.start(
            cfg, _pod(namespace, "nobody-gen-0"), report, env={"KUBECONFIG": str(kubeconfig)}
        )
        assert beat is not None
        eventually(lambda: len(calls) >= 3, 30, "three attempts")
        beat.stop()  # the final renewal fails too, and stop() still returns
    assert beat.renewals == 0
    assert (
        "renewing Lease" in caplog.text and "nobody-nobody-gen-0" in caplog.text and "HTTP 403" in caplog.text
    )
    assert not _get(kubectl, "lease", "nobody-nobody-gen-0", "-n", namespace)
