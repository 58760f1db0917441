"""Running the command-line tools (kubectl, helm) against a cluster from tests, with failures that
show the tool's output. Neighbours: binaries.py (where the tools are), tests/conftest.py (fixtures).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from typing import Protocol


class Tool(Protocol):
    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]: ...


def bind(exe: pathlib.Path, kubeconfig: pathlib.Path) -> Tool:
    """A Tool that runs exe with KUBECONFIG=kubeconfig; check=True raises AssertionError carrying the
    exit code, stdout and stderr."""
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))

    def run(
        *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(exe), *args], input=input, capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{exe.name} {' '.join(args)} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    return run
