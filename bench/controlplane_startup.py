"""Control-plane build and start-up times on this machine.

    .venv/bin/python bench/controlplane_startup.py [--runs 3] [--cold]

Measures: the warm build check (scripts/build-controlplane.sh with everything cached), and the time
from nothing running to a ready control plane (etcd, apiserver, controller-manager, scheduler, node
agent; the default ServiceAccount exists), then to a fake GPU node's pod Running, and the stop time.
--cold also rebuilds everything into an empty GOCACHE (module downloads stay cached): many minutes
on 2 cores and the whole machine, so it is opt-in and meant to be run once.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from kubernetes import client

from bench import stats
from tests.infra import binaries, controlplane, kube, nodes


def timed(fn: Callable[[], object]) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def warm_build_check() -> None:
    subprocess.run([str(binaries.BUILD_SCRIPT)], check=True, stdout=subprocess.DEVNULL)


def cold_build() -> float:
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, GOCACHE=cache, XDG_CACHE_HOME=out)
        start = time.monotonic()
        subprocess.run([str(binaries.BUILD_SCRIPT)], check=True, env=env, stdout=subprocess.DEVNULL)
        return time.monotonic() - start


def first_pod_running(cp: controlplane.ControlPlane) -> float:
    start = time.monotonic()
    api = kube.api_client(cp.kubeconfig)
    core = client.CoreV1Api(api)
    nodes.create(core, [nodes.GpuNode("bench-gpu-0")])
    pod = {
        "metadata": {"name": "bench"},
        "spec": {
            "containers": [{"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }
    core.create_namespaced_pod("default", kube.model(client.V1Pod, pod))
    while True:
        status = core.read_namespaced_pod("bench", "default").status
        if status is not None and status.phase == "Running":
            return time.monotonic() - start
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="also time a build from an empty GOCACHE")
    args = parser.parse_args()

    rows: list[tuple[str, list[float]]] = []
    if args.cold:
        rows.append(("cold build (empty GOCACHE)", [cold_build()]))
    exe = binaries.ensure().plrl_k8s
    rows.append(("warm build check", [timed(warm_build_check) for _ in range(args.runs)]))

    ready: list[float] = []
    phases: list[dict[str, float]] = []
    pod: list[float] = []
    stop: list[float] = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as work:
            cp = controlplane.ControlPlane(pathlib.Path(work), plrl_k8s=exe)
            ready.append(timed(cp.start))
            phases.append(cp.timings)
            try:
                pod.append(first_pod_running(cp))
            finally:
                stop.append(timed(cp.stop))
    rows += [("start to ready", ready), ("ready to first GPU pod Running", pod), ("stop", stop)]

    print(f"{'step':34} {'median s':>9} {'min s':>7} {'max s':>7}  runs")
    for name, xs in rows:
        med, lo, hi = stats.median_spread(xs)
        print(f"{name:34} {med:9.2f} {lo:7.2f} {hi:7.2f}  {len(xs)}")
    print("start-up phases (median s since start):")
    for phase in phases[0]:
        print(f"  {phase:32} {statistics.median(p[phase] for p in phases if phase in p):9.2f}")
    print(f"warm start goal: < 30 s to ready -> {'met' if statistics.median(ready) < 30 else 'NOT met'}")


if __name__ == "__main__":
    main()
