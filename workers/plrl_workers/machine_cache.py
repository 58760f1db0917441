"""Where plrl keeps what it builds once per machine: `$XDG_CACHE_HOME/plrl`, else `~/.cache/plrl`.

The shell scripts (`scripts/setup-venv.sh`, `scripts/build-controlplane.sh`) use the same folder,
so a venv's uv, the control plane, prepared models and compiled ops sit side by side; deleting any
of it is safe.
"""

from __future__ import annotations

import os
import pathlib


def home() -> pathlib.Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache") / "plrl"
