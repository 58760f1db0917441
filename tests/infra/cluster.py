"""`make cluster-up` / `make cluster-down`: a control plane that outlives the command that started it,
for working against by hand or for reusing across pytest runs (PLRL_KUBECONFIG).

    python -m tests.infra.cluster up [--dir .cluster]     prints `export KUBECONFIG=...`
    python -m tests.infra.cluster down [--dir .cluster]

Neighbours: controlplane.py (does the work; its state file records the pids), tests/conftest.py.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import time

from tests.infra import binaries, controlplane


def up(work_dir: pathlib.Path) -> None:
    if (work_dir / controlplane.STATE_FILE).exists():
        sys.exit(f"cluster-up: a cluster is recorded in {work_dir}; run `make cluster-down` first")
    shutil.rmtree(work_dir, ignore_errors=True)  # leftovers of a crashed cluster: stale etcd data
    work_dir.mkdir(parents=True)
    start = time.monotonic()
    cp = controlplane.ControlPlane(work_dir, plrl_k8s=binaries.ensure().plrl_k8s, detach=True).start()
    print(
        f"cluster-up: ready in {time.monotonic() - start:.1f} s at {cp.server}; logs in {cp.logs}",
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
    args = parser.parse_args()
    (up if args.action == "up" else down)(args.dir.resolve())


if __name__ == "__main__":
    main()
