"""Operator latency and load on the local control plane (not a test: prints numbers).

1. Latency: create one job at a time (POST to the API server) and time until both of its
   StatefulSets exist; p50 / p95 over --jobs-latency jobs.
2. Burst: create --burst jobs at once; time until every job has both StatefulSets and a status
   with observedGeneration; the operator's RSS and CPU seconds over the burst; API requests per job
   (from the operator's own counters, by verb).

The operator runs as a local process with the Helm chart's ServiceAccount token, as in
tests/operator. Burst jobs are created suspended by default (StatefulSets at 0 replicas), so the
numbers are the operator's, not the scheduler's; pass --burst-running to create pods too.

    .venv/bin/python bench/operator_latency.py [--jobs-latency 20] [--burst 200]
Uses the cluster of `make cluster-up` when PLRL_KUBECONFIG is set, else starts its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import psutil
from kubernetes import client
from prometheus_client import parser

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.infra import binaries, controlplane, kube, procs, tokens  # noqa: E402

GROUP, VERSION, PLURAL = "pipelinerl.io", "v1alpha1", "pipelinerljobs"


@contextlib.contextmanager
def cluster(work: pathlib.Path) -> Iterator[pathlib.Path]:
    reuse = os.environ.get("PLRL_KUBECONFIG")
    if reuse:
        yield pathlib.Path(reuse)
        return
    binaries.ensure()
    with controlplane.ControlPlane(work / "cp").start() as cp:
        yield cp.kubeconfig


def job(name: str, suspend: bool) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PipelineRLJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "/models/tiny"},
            "resources": {"totalGPUs": 4, "gpusPerTrainer": 2, "cpu": "1", "memory": "1Gi"},
            "pipeline": {"generators": 2},
            "generation": {"maxNewTokens": 256},
            "training": {"batchSize": 64},
            "suspend": suspend,
        },
    }


def counters(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "plrl_operator_api_requests_total":
                out[s.labels["verb"]] = out.get(s.labels["verb"], 0.0) + s.value
    return out


def both_statefulsets(apps: client.AppsV1Api, ns: str) -> set[str]:
    """Jobs (by name) that have both StatefulSets."""
    seen: dict[str, int] = {}
    for sts in apps.list_namespaced_stateful_set(ns, label_selector="pipelinerl.io/job").items:
        j = sts.metadata.labels["pipelinerl.io/job"]
        seen[j] = seen.get(j, 0) + 1
    return {j for j, n in seen.items() if n == 2}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs-latency", type=int, default=20)
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--burst-running", action="store_true", help="burst jobs not suspended (pods too)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, cluster(pathlib.Path(tmp)) as kubeconfig:
        work = pathlib.Path(tmp)
        helm = binaries.ensure().helm
        env = dict(os.environ, KUBECONFIG=str(kubeconfig))
        subprocess.run(
            [str(helm), "upgrade", "--install", "plrl", str(ROOT / "helm/pipelinerl-operator"),
             "-n", "plrl-system", "--create-namespace", "--set", "replicaCount=0,webhook.enabled=false",
             "--wait"],
            check=True, env=env, capture_output=True,
        )  # fmt: skip
        api = kube.api_client(kubeconfig)
        core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
        token = tokens.service_account_token(core, "plrl-system", "plrl-pipelinerl-operator")
        op_kubeconfig = tokens.token_kubeconfig(kubeconfig, token, work / "op.kubeconfig")
        mport, lport = procs.free_port(), procs.free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "plrl_operator", "--all-namespaces", "--standalone",
             f"--metrics-port={mport}", f"--liveness-port={lport}"],
            env=dict(os.environ, KUBECONFIG=str(op_kubeconfig)), stdout=(work / "op.log").open("wb"),
            stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{lport}/healthz", timeout=1)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            me = psutil.Process(proc.pid)

            ns = "bench-latency"
            core.create_namespace(kube.model(client.V1Namespace, {"metadata": {"name": ns}}))
            time.sleep(2)  # the namespace's default ServiceAccount
            lat = []
            for i in range(args.jobs_latency):
                t0 = time.perf_counter()
                custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job(f"lat-{i}", False))
                while f"lat-{i}" not in both_statefulsets(apps, ns):
                    time.sleep(0.02)
                lat.append(time.perf_counter() - t0)
            lat.sort()
            p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
            print(f"apply -> both StatefulSets: p50 {statistics.median(lat) * 1000:.0f} ms, "
                  f"p95 {p95 * 1000:.0f} ms (n={len(lat)})")  # fmt: skip

            ns = "bench-burst"
            core.create_namespace(kube.model(client.V1Namespace, {"metadata": {"name": ns}}))
            time.sleep(2)
            before, cpu0 = counters(mport), me.cpu_times()
            rss_peak = me.memory_info().rss
            t0 = time.perf_counter()
            for i in range(args.burst):
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, job(f"burst-{i}", not args.burst_running)
                )
            created = time.perf_counter() - t0
            while True:
                rss_peak = max(rss_peak, me.memory_info().rss)
                done = both_statefulsets(apps, ns)
                jobs = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
                with_status = sum(1 for j in jobs if j.get("status", {}).get("observedGeneration"))
                if len(done) == args.burst and with_status == args.burst:
                    break
                time.sleep(1.0)  # two LISTs of 200 objects: poll gently, the API server shares 2 cores
            total = time.perf_counter() - t0
            time.sleep(6)  # a timer tick on every job: steady state must add no writes
            after, cpu1 = counters(mport), me.cpu_times()
            per_job = {v: (after.get(v, 0) - before.get(v, 0)) / args.burst for v in sorted(after)}
            cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
            print(f"{args.burst} jobs at once: created in {created:.1f} s, all reconciled (both StatefulSets "
                  f"and status) after {total:.1f} s")  # fmt: skip
            print(f"operator: peak RSS {rss_peak / 2**20:.0f} MiB, CPU {cpu:.1f} s over the burst "
                  f"(+6 s idle), {cpu / args.burst * 1000:.0f} ms CPU per job")  # fmt: skip
            print(
                "API requests per job (by verb): " + json.dumps({k: round(v, 2) for k, v in per_job.items()})
            )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
