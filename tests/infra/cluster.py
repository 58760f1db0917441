"""`make cluster-up` / `make cluster-down`: the e2e tests' environment by hand, outliving the command
that started it: the control plane with the node agent (whose process runner really runs pods), two
fake 8-GPU nodes for it, the chart installed, the operator running as a process under the chart's
ServiceAccount, the demo model on a volume and the claims examples/cluster-tiny.yaml names.

    python -m tests.infra.cluster up [--dir .cluster] [--bare]   prints `export KUBECONFIG=...`
    python -m tests.infra.cluster down [--dir .cluster]

then `kubectl apply -f examples/cluster-tiny.yaml` trains (docs/controlplane.md). `--bare` starts only
the control plane and the node agent: what pytest reuses through PLRL_KUBECONFIG (its fixtures install
the chart and run their own operator, which a second operator would pause through kopf peering).

Neighbours: controlplane.py (does the work; its state file records the pids, the operator's too),
demo.py (model and claims), tests/conftest.py (PLRL_KUBECONFIG).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from plrl_workers import machine_cache
from tests.infra import binaries, controlplane, demo, kube, nodes, procs, tokens, tools

CHART = binaries.REPO / "helm" / "pipelinerl-operator"
RELEASE, RELEASE_NS = "plrl", "plrl-system"
SA_NAME = "plrl-pipelinerl-operator"  # the chart's fullname for release "plrl"
PEERING = "pipelinerl-operator"
NODES = ("gpu-dev-0", "gpu-dev-1")
DEMO_MODELS = machine_cache.home() / "demo-models"
TOKEN_SECONDS = 7 * 24 * 3600


def _environment(cp: controlplane.ControlPlane, work_dir: pathlib.Path) -> None:
    """Nodes, chart, demo model and claims, and the operator (recorded in the state file)."""
    from kubernetes import client

    core = client.CoreV1Api(kube.api_client(cp.kubeconfig))
    nodes.create(core, [nodes.GpuNode(name=n, runner="process") for n in NODES])
    helm = tools.bind(binaries.ensure().helm, cp.kubeconfig)
    helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--create-namespace",
        "--set", "replicaCount=0", "--wait", "--timeout", "90s",
    )  # fmt: skip
    print("cluster-up: preparing the demo model (once per machine, ~20 s)...", file=sys.stderr)
    demo.prepare_model(DEMO_MODELS)
    kubectl = tools.bind(binaries.kubectl(), cp.kubeconfig)
    volumes = demo.volumes("default", DEMO_MODELS, work_dir / "volumes" / "checkpoints")
    kubectl("apply", "-f", "-", input=demo.dump_all(volumes))
    token = tokens.service_account_token(core, RELEASE_NS, SA_NAME, seconds=TOKEN_SECONDS)
    kubeconfig = tokens.token_kubeconfig(cp.kubeconfig, token, work_dir / "operator.kubeconfig")
    log = (cp.logs / "operator.log").open("ab")
    ports = f"--metrics-port={procs.free_port()}", f"--liveness-port={procs.free_port()}"
    operator = subprocess.Popen(
        [sys.executable, "-m", "plrl_operator", "--all-namespaces", f"--peering={PEERING}", *ports,
         "--status-interval=2"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=binaries.REPO,
        env=dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1"), start_new_session=True,
    )  # fmt: skip
    log.close()
    state_file = work_dir / controlplane.STATE_FILE
    state = json.loads(state_file.read_text())
    state["pids"]["operator"] = operator.pid  # stopped first by cluster-down (it comes last)
    state_file.write_text(json.dumps(state, indent=2))


def up(work_dir: pathlib.Path, bare: bool) -> None:
    if (work_dir / controlplane.STATE_FILE).exists():
        sys.exit(f"cluster-up: a cluster is recorded in {work_dir}; run `make cluster-down` first")
    shutil.rmtree(work_dir, ignore_errors=True)  # leftovers of a crashed cluster: stale etcd data
    work_dir.mkdir(parents=True)
    start = time.monotonic()
    cp = controlplane.ControlPlane(work_dir, plrl_k8s=binaries.ensure().plrl_k8s, detach=True).start()
    if not bare:
        try:
            _environment(cp, work_dir)
        except BaseException:
            controlplane.stop_recorded(work_dir)
            raise
    what = "control plane" if bare else "control plane, 2 fake GPU nodes that run pods, chart, operator"
    print(
        f"cluster-up: {what} ready in {time.monotonic() - start:.1f} s at {cp.server}; logs in {cp.logs}",
        file=sys.stderr,
    )
    if not bare:
        print(
            "cluster-up: try `kubectl apply -f examples/cluster-tiny.yaml; kubectl get plrljobs -w`",
            file=sys.stderr,
        )
    print(f"export KUBECONFIG={cp.kubeconfig} PLRL_KUBECONFIG={cp.kubeconfig}")


def down(work_dir: pathlib.Path) -> None:
    stopped = controlplane.stop_recorded(work_dir)
    print(f"cluster-down: stopped {', '.join(stopped) or 'nothing (no cluster recorded)'}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--dir", type=pathlib.Path, default=binaries.REPO / ".cluster")
    parser.add_argument("--bare", action="store_true", help="only the control plane and the node agent")
    args = parser.parse_args()
    if args.action == "up":
        up(args.dir.resolve(), args.bare)
    else:
        down(args.dir.resolve())


if __name__ == "__main__":
    main()
