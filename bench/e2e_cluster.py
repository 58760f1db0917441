"""The tiny job through the cluster path and through `plrl run`, side by side (not a test: prints numbers).

For each repeat, examples/cluster-tiny.yaml is `kubectl apply`-ed onto a fake GPU node whose pods
really run (the node agent's process runner), with the operator running as a process under the chart's
ServiceAccount, and then the same job (the model at its host path) runs through `plrl run`. Both are
timed the same way, from `kubectl apply` / the `plrl run` command:

- first step: the first line of the trainer's metrics.jsonl (on the checkpoint volume / in the run
  directory), and for the cluster also `STEP >= 1` in the job's status (what `kubectl get plrljobs`
  shows, one heartbeat and one status interval later);
- done: the job `Succeeded` / `plrl run` exited 0; for the cluster also until its pods are gone.

The difference is what the cluster path adds (scheduling, the pod sandbox and volumes, the operator's
reconcile and status loop, Lease heartbeats); the training itself is the same worker code.

    .venv/bin/python bench/e2e_cluster.py [--repeats 3] [--out runs/bench-e2e.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.infra import binaries, controlplane, demo, kube, nodes, tokens, tools  # noqa: E402

RELEASE, RELEASE_NS, SA = "plrl", "plrl-system", "plrl-pipelinerl-operator"


def _first_line_at(
    path: pathlib.Path, since: float, proc: subprocess.Popen[str] | None = None
) -> float | None:
    while True:
        if path.exists() and path.read_text().strip():
            return time.monotonic() - since
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.1)


def cluster_run(
    kubectl: tools.Tool, ns: str, doc: dict[str, Any], ckpt: pathlib.Path, work: pathlib.Path
) -> dict[str, float]:
    job_file = work / f"{ns}.yaml"
    job_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    t0 = time.monotonic()
    kubectl("apply", "-n", ns, "-f", str(job_file))
    out: dict[str, float] = {}
    metrics = ckpt / "metrics.jsonl"
    while "succeeded_s" not in out:
        if time.monotonic() - t0 > 600:
            raise TimeoutError(f"{ns}: not Succeeded after 600 s")
        st = json.loads(kubectl("get", "plrljob", "tiny", "-n", ns, "-o", "json").stdout).get("status", {})
        now = time.monotonic() - t0
        if st.get("phase") == "Running":
            out.setdefault("running_s", now)
        if "first_step_file_s" not in out and metrics.exists() and metrics.read_text().strip():
            out["first_step_file_s"] = now
        if (st.get("step") or 0) >= 1:
            out.setdefault("first_step_status_s", now)
        if st.get("phase") == "Succeeded":
            out["succeeded_s"] = now
        if st.get("phase") == "Failed":
            raise RuntimeError(f"{ns}: Failed: {st.get('conditions')}")
        time.sleep(0.2)
    while json.loads(kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]:
        time.sleep(0.2)
    out["pods_gone_s"] = time.monotonic() - t0
    return out


def local_run(doc: dict[str, Any], model: pathlib.Path, work: pathlib.Path, name: str) -> dict[str, float]:
    job_file = work / f"{name}-local.yaml"
    local = demo.merge(doc, {"spec": {"model": {"name": str(model)}}})
    job_file.write_text(yaml.safe_dump(local, sort_keys=False))
    run_dir = work / f"{name}-run"
    t0 = time.monotonic()
    argv = [
        sys.executable,
        "-m",
        "plrl_operator.cli",
        "run",
        str(job_file),
        "--run-dir",
        str(run_dir),
        "--quiet",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    first = _first_line_at(run_dir / "metrics.jsonl", t0, proc)
    _, err = proc.communicate(timeout=600)
    if proc.returncode != 0 or first is None:
        raise RuntimeError(f"plrl run failed ({proc.returncode}): {err[-2000:]}")
    return {"first_step_file_s": first, "succeeded_s": time.monotonic() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()
    from kubernetes import client

    from tests.operator.cluster import support

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        work = pathlib.Path(tmp)
        models = work / "models"
        demo.prepare_model(models)
        binaries.ensure()
        with controlplane.ControlPlane(work / "cp").start() as cp:
            core = client.CoreV1Api(kube.api_client(cp.kubeconfig))
            helm = tools.bind(binaries.ensure().helm, cp.kubeconfig)
            kubectl = tools.bind(binaries.kubectl(), cp.kubeconfig)
            helm("upgrade", "--install", RELEASE, str(support.CHART), "-n", RELEASE_NS, "--create-namespace",
                 "--set", "replicaCount=0", "--wait", "--timeout", "90s")  # fmt: skip
            token = tokens.service_account_token(core, RELEASE_NS, SA)
            op = support.Operator(tokens.token_kubeconfig(cp.kubeconfig, token, work / "op.kubeconfig"), work)
            op.start()
            nodes.create(core, [nodes.GpuNode(name="gpu-bench-0", runner="process")])
            try:
                for r in range(args.repeats):
                    ns = f"bench-{r}"
                    kubectl("create", "namespace", ns)
                    ckpt = work / f"{ns}-checkpoints"
                    kubectl("apply", "-f", "-", input=demo.dump_all(demo.volumes(ns, models, ckpt)))
                    doc = demo.job()
                    c = cluster_run(kubectl, ns, doc, ckpt, work)
                    local = local_run(doc, models / demo.MODEL_NAME, work, ns)
                    load = os.getloadavg()[0]
                    results.append({"repeat": r, "cluster": c, "plrl_run": local, "load1": round(load, 2)})
                    print(json.dumps(results[-1]), flush=True)
            finally:
                op.stop()

    def med(path: tuple[str, str]) -> float:
        return float(statistics.median(r[path[0]][path[1]] for r in results if path[1] in r[path[0]]))

    print(f"\ntiny job (examples/cluster-tiny.yaml, {demo.job()['spec']['training']['totalSteps']} steps), "
          f"median of {len(results)} (seconds from kubectl apply / the plrl run command):")  # fmt: skip
    rows = [
        (
            "first trained step (metrics.jsonl)",
            ("cluster", "first_step_file_s"),
            ("plrl_run", "first_step_file_s"),
        ),
        ("Succeeded / plrl run exited", ("cluster", "succeeded_s"), ("plrl_run", "succeeded_s")),
    ]
    print(f"{'':40} {'cluster':>9} {'plrl run':>9} {'added':>7}")
    for label, a, b in rows:
        print(f"{label:40} {med(a):9.1f} {med(b):9.1f} {med(a) - med(b):7.1f}")
    print(f"{'first STEP in kubectl get plrljobs':40} {med(('cluster', 'first_step_status_s')):9.1f}")
    print(f"{'pods gone':40} {med(('cluster', 'pods_gone_s')):9.1f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
